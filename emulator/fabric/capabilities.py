"""What this machine can do, found by trying it, never by guessing from versions.

Each probe runs in a throwaway namespace of the project's prefix (``bp-probe-<pid>``) that it
removes again, so a probe touches nothing of the host's.
"""
from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

from pyroute2.netlink.exceptions import NetlinkError

from emulator import REPO
from emulator.fabric import netns

HEADERS_DIR = Path("/var/lib/backplane/kernel-headers/current")
NETEM_FIX = (
    "this kernel has no sch_netem, so the long-haul delay cannot run here. Load it if it is a "
    "module (modprobe sch_netem; on Ubuntu: apt-get install linux-modules-extra-$(uname -r)), "
    "or run in the delay tier's VM, whose stock kernel has it (sudo make vm-test; "
    "backplane vm run -- CMD), or run without the delay: backplane up --no-wan-delay"
)


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


def _probe_ns() -> str:
    return f"bp-probe-{os.getpid()}"


def try_qdisc(kind: str, **params) -> str | None:
    """Add a ``kind`` qdisc to a veth in a throwaway namespace; None if it works, else the error."""
    name = _probe_ns()
    netns.create(name)
    try:
        ipr = netns.iproute(name)
        try:
            ipr.link("add", ifname="probe0", kind="veth", peer={"ifname": "probe1"})
            idx = ipr.link_lookup(ifname="probe0")[0]
            ipr.tc("add", kind, idx, 0x10000, **params)
            got = [q.get_attr("TCA_KIND") for q in ipr.get_qdiscs(index=idx)]
            if kind not in got:
                return f"the kernel accepted a {kind} qdisc but reports {got}"
            return None
        except NetlinkError as e:
            return f"adding a {kind} qdisc failed: {os.strerror(e.code)} (errno {e.code})"
        finally:
            ipr.close()
    finally:
        netns.remove(name)


@lru_cache(maxsize=None)
def has_netem() -> bool:
    return try_qdisc("netem", delay=1000) is None


def mem_available() -> int | None:
    """Bytes of memory the kernel says new work can have (MemAvailable), or None if unknown."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def bcc_kernel_source() -> str | None:
    """Where bcc should find kernel headers: None when the running kernel's own are installed."""
    if os.environ.get("BCC_KERNEL_SOURCE"):
        return os.environ["BCC_KERNEL_SOURCE"]
    if Path(f"/lib/modules/{platform.release()}/build/include").is_dir():
        return None
    if HEADERS_DIR.is_dir():
        return str(HEADERS_DIR.resolve())
    return None


def bcc_env() -> dict[str, str]:
    env = dict(os.environ)
    src = bcc_kernel_source()
    if src:
        env["BCC_KERNEL_SOURCE"] = src
    return env


def check_bcc() -> Check:
    """Compile and load a trivial tc program with bcc, in a child process (bcc is heavy)."""
    program = REPO / "ebpf" / "doctor_probe.c"
    code = (
        "import sys\nfrom bcc import BPF\n"
        f"b = BPF(src_file={str(program)!r})\n"
        "fn = b.load_func('doctor_probe', BPF.SCHED_CLS)\n"
        "print('loaded fd', fn.fd)\n"
    )
    fix = "sudo scripts/setup.sh (installs python3-bpfcc and kernel headers bcc can use)"
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env=bcc_env(), timeout=120)
    except subprocess.TimeoutExpired:
        return Check("bcc", False, "compiling a trivial program took over 120 s", fix)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return Check("bcc", False, f"cannot compile a trivial tc program: {last}", fix)
    src = bcc_kernel_source() or f"/lib/modules/{platform.release()}/build"
    return Check("bcc", True, f"compiled and loaded a tc program (headers: {src})")


def _tool(name: str, binary: str, package: str) -> Check:
    found = shutil.which(binary)
    if found:
        return Check(name, True, found)
    return Check(name, False, f"{binary} not found", f"apt-get install --no-install-recommends {package}")


def doctor() -> list[Check]:
    """Every capability backplane needs, each with its status and the command that fixes it."""
    checks = []
    root = os.geteuid() == 0
    checks.append(Check("root", root, "running as root" if root else f"running as uid {os.geteuid()}",
                        "" if root else "run with sudo"))
    checks.append(_tool("mnexec", "mnexec", "mininet"))
    checks.append(_tool("iproute2", "ip", "iproute2"))
    checks.append(_tool("tc", "tc", "iproute2"))
    checks.append(_tool("ping", "ping", "iputils-ping"))
    checks.append(_tool("ethtool", "ethtool", "ethtool"))
    checks.append(_tool("tcpdump", "tcpdump", "tcpdump"))
    checks.append(_tool("tshark", "tshark", "tshark"))
    checks.append(_tool("clang", "clang", "clang"))
    # The delay tier's VM (needed only where the kernel has no sch_netem).
    checks.append(_tool("qemu", "qemu-system-x86_64", "qemu-system-x86"))
    checks.append(_tool("debootstrap", "debootstrap", "debootstrap"))
    if not root:
        checks.append(Check("namespaces", False, "needs root to try", "run with sudo"))
        return checks
    for kind, params in (("htb", {"default": 0x10}), ("tbf", {"rate": "10mbit", "burst": 20000, "latency": 50000})):
        err = try_qdisc(kind, **params)
        checks.append(Check(f"qdisc {kind}", err is None, err or f"{kind} qdisc added in a throwaway namespace",
                            "" if err is None else "a kernel with CONFIG_NET_SCH_" + kind.upper()))
    err = try_qdisc("netem", delay=1000)
    checks.append(Check("qdisc netem", err is None, err or "netem qdisc added in a throwaway namespace",
                        "" if err is None else NETEM_FIX))
    checks.append(check_bcc())
    return checks
