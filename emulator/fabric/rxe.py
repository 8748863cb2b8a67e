"""A kernel RoCEv2 peer for the soft-NIC: Linux Soft-RoCE (rdma_rxe) on one end of a veth pair,
the other end in a namespace of the project's where a soft-NIC can run.

rdma_rxe (as of Linux 6.1) opens its UDP port 4791 in the root namespace only, so its end of
the pair stays there, with the rxe device on it; the soft-NIC's end goes into a throwaway
namespace named ``bp-probe-rxe<pid>`` (``backplane clean`` removes it once that process is
gone). Removing the namespace removes the pair, and with its netdev gone the kernel removes the
rxe device too, so a crash leaves nothing behind that ``clean`` cannot take. Both ends get
static neighbour entries: the peers never wait on ARP. The veth keeps MTU 1500, so the RoCE
path MTU is 1024, as rxe derives it.
"""
from __future__ import annotations

import importlib
import ipaddress
import os
import shutil
import subprocess
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from emulator.errors import CapabilityError, FabricError
from emulator.fabric import netns

SUBNET = "198.19.254.0/30"  # benchmarking range (RFC 2544), on a veth of our own only
IB_SYSFS = Path("/sys/class/infiniband")
NIC_IFNAME = "nic0"
PATH_MTU = 1024  # what rxe takes from a 1500-byte netdev
GID_WAIT_S = 5.0  # the kernel fills the GID table from the netdev's address asynchronously
MODULES = ("rdma_rxe", "ib_uverbs")
MODULE_FIX = ("modprobe rdma_rxe ib_uverbs (Debian's stock kernel has them; on Ubuntu: apt-get install "
              "linux-modules-extra-$(uname -r)); on a kernel without them (this project's CI machines), "
              "run in the delay tier's VM: backplane vm run -- .venv/bin/python examples/rxe_interop.py")


@dataclass(frozen=True)
class RxeLink:
    """What the two peers need to know: the rxe device and its address, the soft-NIC's
    namespace and address, and the GID index rxe sends RoCEv2 from."""

    device: str
    netdev: str
    rxe_ip: str
    namespace: str
    nic_ip: str
    gid_index: int
    path_mtu: int = PATH_MTU


def check() -> None:
    """Raise CapabilityError unless this machine can run an rxe peer: the modules, the `rdma`
    tool (iproute2) and libibverbs' Python bindings (python3-pyverbs with ibverbs-providers)."""
    if shutil.which("rdma") is None:
        raise CapabilityError("the `rdma` tool (iproute2) is missing", "apt-get install iproute2")
    try:
        importlib.import_module("pyverbs.device")
    except ImportError as e:
        raise CapabilityError(f"libibverbs' Python bindings are missing ({e})",
                              "apt-get install --no-install-recommends python3-pyverbs ibverbs-providers "
                              "(or: sudo make setup)") from e
    for module in MODULES:
        if Path("/sys/module", module).exists():
            continue
        r = subprocess.run(["modprobe", module], capture_output=True, text=True)
        if r.returncode != 0 or not Path("/sys/module", module).exists():
            raise CapabilityError(f"this kernel has no {module} ({(r.stderr or r.stdout).strip() or 'not loaded'})",
                                  MODULE_FIX)


def _run(*argv: str) -> None:
    r = subprocess.run(argv, capture_output=True, text=True)
    if r.returncode != 0:
        raise FabricError(f"{' '.join(argv)} failed: {(r.stderr or r.stdout).strip()}")


def _gid_index(device: str, ip: str) -> int:
    """The GID table entry of type RoCE v2 that holds ``ip`` (as ::ffff:a.b.c.d)."""
    want = ipaddress.IPv6Address(f"::ffff:{ip}")
    port = IB_SYSFS / device / "ports" / "1"
    deadline = time.monotonic() + GID_WAIT_S
    while True:
        for entry in sorted((port / "gids").iterdir(), key=lambda p: int(p.name)):
            try:
                gid = ipaddress.IPv6Address(entry.read_text().strip())
                kind = (port / "gid_attrs" / "types" / entry.name).read_text().strip()
            except (OSError, ValueError):
                continue  # an empty slot reads as EINVAL
            if gid == want and kind == "RoCE v2":
                return int(entry.name)
        if time.monotonic() > deadline:
            raise FabricError(f"{device} has no RoCE v2 GID for {ip} after {GID_WAIT_S:.0f} s")
        time.sleep(0.05)


def up(subnet: str = SUBNET) -> RxeLink:
    """Build the pair and the rxe device; the caller owns them until ``down``."""
    check()
    net = ipaddress.IPv4Network(subnet)
    rxe_ip, nic_ip = (str(a) for a in list(net.hosts())[:2])
    pid = os.getpid()
    ns, netdev, device = f"bp-probe-rxe{pid}", f"bp-rxe{pid}", f"bp-rxe{pid}"  # netdev <= 15 chars
    netns.create(ns)
    try:
        from pyroute2 import IPRoute

        with IPRoute() as ipr:
            ipr.link("add", ifname=netdev, kind="veth", peer={"ifname": f"{netdev}n"})
            ipr.link("set", index=ipr.link_lookup(ifname=f"{netdev}n")[0], net_ns_fd=ns, ifname=NIC_IFNAME)
            idx = ipr.link_lookup(ifname=netdev)[0]
            ipr.addr("add", index=idx, address=rxe_ip, prefixlen=net.prefixlen)
            ipr.link("set", index=idx, state="up")
            rxe_mac = ipr.get_links(idx)[0].get_attr("IFLA_ADDRESS")
        with netns.iproute(ns) as nipr:
            nidx = nipr.link_lookup(ifname=NIC_IFNAME)[0]
            nipr.addr("add", index=nidx, address=nic_ip, prefixlen=net.prefixlen)
            nipr.link("set", index=nidx, state="up")
            nipr.link("set", index=nipr.link_lookup(ifname="lo")[0], state="up")
            nic_mac = nipr.get_links(nidx)[0].get_attr("IFLA_ADDRESS")
            nipr.neigh("add", dst=rxe_ip, lladdr=rxe_mac, ifindex=nidx, state="permanent")
        with IPRoute() as ipr:
            ipr.neigh("add", dst=nic_ip, lladdr=nic_mac, ifindex=idx, state="permanent")
        _run("rdma", "link", "add", device, "type", "rxe", "netdev", netdev)
        return RxeLink(device, netdev, rxe_ip, ns, nic_ip, _gid_index(device, rxe_ip))
    except BaseException:
        _remove(ns, netdev, device)
        raise


def _remove(ns: str, netdev: str, device: str) -> None:
    from pyroute2 import IPRoute

    if (IB_SYSFS / device).exists():
        subprocess.run(["rdma", "link", "delete", device], capture_output=True)
    with IPRoute() as ipr:
        for idx in ipr.link_lookup(ifname=netdev):
            ipr.link("del", index=idx)  # and its peer with it
    netns.remove(ns)


def down(link: RxeLink) -> None:
    _remove(link.namespace, link.netdev, link.device)


@contextmanager
def rxe_link(subnet: str = SUBNET) -> Iterator[RxeLink]:
    link = up(subnet)
    try:
        yield link
    finally:
        down(link)
