"""Datapath tier: the switch programs compiled with bcc and run on crafted packets
(BPF_PROG_TEST_RUN) inside a throwaway namespace whose ports have the ifindexes the maps name."""
from __future__ import annotations

import ctypes as ct
import os
import struct

import pytest

if os.geteuid() != 0:
    pytest.skip("the datapath tier loads BPF programs: run as root (sudo make test)", allow_module_level=True)

from pyroute2 import IPRoute  # noqa: E402

from emulator.bpf import structs as S
from emulator.bpf.datapath import Datapath
from emulator.fabric import netns

NS = f"bp-probe-dp{os.getpid()}"
IN_PORT, PEER_PORT = 201, 202  # a switch port and the port at the other end of its wire
FIBER_PORT = 203  # a non-switch port (count only)
NEXT_HOPS = list(range(301, 309))  # 8 egress ports (only named in maps: a test run redirects nowhere)
NODE_ID = 7
MAC_IN, MAC_PEER = "02:62:70:00:07:00", "02:62:70:00:08:00"
FRAME = 4096 + 128


@pytest.fixture(scope="session")
def dp():
    d = Datapath()
    yield d
    d.close()


@pytest.fixture(scope="session")
def ns():
    """A namespace holding ports 201 (switch) <-> 202, and 203, so test runs can name them."""
    netns.create(NS)
    try:
        with netns.entered(NS):
            ipr = IPRoute()
        ipr.link("add", ifname="sw0", kind="veth", index=IN_PORT, peer={"ifname": "peer0"})
        ipr.link("add", ifname="fib0", kind="veth", index=FIBER_PORT, peer={"ifname": "fibpeer0"})
        for name in ("sw0", "peer0", "fib0", "fibpeer0"):
            ipr.link("set", index=ipr.link_lookup(ifname=name)[0], state="up")
        assert ipr.link_lookup(ifname="sw0") == [IN_PORT]
        yield ipr
        ipr.close()
    finally:
        netns.remove(NS)


@pytest.fixture
def programmed(dp, ns):
    """Maps as user space writes them for one switch port with an 8-way route to 198.18.1.0/24."""
    return program(dp)


def program(dp: Datapath) -> Datapath:
    """Write the maps the ``programmed`` fixture describes into ``dp``."""
    dp.set_hash("qpn")
    dp.set_ecn(kmin=8000, kmax=24000, pmax=0.2)
    dp.set_dscp_prio(3)
    dp.set_port(IN_PORT, S.Port(NODE_ID, S.PORT_SWITCH, 0, 32000, S.mac_bytes(MAC_IN), S.mac_bytes(MAC_PEER)))
    dp.set_port(FIBER_PORT, S.Port(NODE_ID + 1, 0, IN_PORT, 0, S.mac_bytes(MAC_PEER), S.mac_bytes(MAC_IN)))
    for i, nh in enumerate(NEXT_HOPS):
        dp.set_port(nh, next_hop_entry(i))
    import ipaddress

    dp.set_route(NODE_ID, ipaddress.IPv4Network("198.18.1.0/24"), NEXT_HOPS)
    return dp


def next_hop_entry(i: int) -> S.Port:
    """Next hop ``i`` of the switch: a port whose MACs name it (its peer's MAC ends in ``i``)."""
    return S.Port(NODE_ID, S.PORT_SWITCH, 0, 32000, S.mac_bytes(f"02:62:70:00:07:{i + 1:02x}"),
                  S.mac_bytes(f"02:62:70:00:09:{i:02x}"))


def reset_port(dp: Datapath, ifindex: int) -> None:
    """Zero a port's counters and queues between fixtures."""
    ncpu = len(dp.table("bp_counters")[ct.c_int(ifindex)])
    dp.table("bp_counters")[ct.c_int(ifindex)] = (S.Counters * ncpu)()
    for slot in range(S.QUEUE_SLOTS):
        dp.table("bp_queues")[ct.c_int(ifindex * S.QUEUE_SLOTS + slot)] = S.Queue()


def skb_ctx(ifindex: int) -> bytes:
    """struct __sk_buff with only ifindex set (the test run's device)."""
    buf = bytearray(192)  # sizeof(struct __sk_buff) on 6.x
    struct.pack_into("=I", buf, 40, ifindex)  # offsetof(struct __sk_buff, ifindex)
    return bytes(buf)
