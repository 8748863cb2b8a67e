"""Named network namespaces: enter, attach, list, find their processes, remove.

Mininet starts each node's shell in a fresh, unnamed network namespace. backplane names it
(``ip netns``-style bind mount under /run/netns) with the fabric's prefix so that users can
reach it with ``ip netns exec``, pyroute2 can open netlink sockets in it, and ``clean`` can find
everything the project made after a crash without guessing from process names.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from contextlib import contextmanager
from typing import Iterator, Sequence

from pyroute2 import IPRoute
from pyroute2 import netns as _netns

NETNS_DIR = "/run/netns"


def path(name: str) -> str:
    return os.path.join(NETNS_DIR, name)


def exists(name: str) -> bool:
    return os.path.exists(path(name))


def names(prefix: str = "") -> list[str]:
    try:
        entries = os.listdir(NETNS_DIR)
    except FileNotFoundError:
        return []
    return sorted(n for n in entries if n.startswith(prefix))


def attach(name: str, pid: int) -> None:
    """Give the network namespace of ``pid`` the name ``name``."""
    _netns.attach(name, pid)


def create(name: str) -> None:
    _netns.create(name)


@contextmanager
def entered(name: str) -> Iterator[None]:
    """Run the body with this thread inside namespace ``name``; sockets opened here stay in it.
    A namespace that does not exist raises (FileNotFoundError); pyroute2, given a name, would
    create it, and lists every namespace to decide, which a thousand-node build cannot afford."""
    fd = os.open(path(name), os.O_RDONLY)
    try:
        _netns.pushns(fd)
    finally:
        os.close(fd)
    try:
        yield
    finally:
        _netns.popns()


def iproute(name: str) -> IPRoute:
    """A netlink socket bound to namespace ``name`` (no helper process, unlike NetNS)."""
    with entered(name):
        return IPRoute()


def write_sysctl(name: str, key: str, value: str | int) -> None:
    """Set a per-namespace sysctl (net.*) inside ``name``, never the host's."""
    with entered(name):
        write_sysctls_here([(key, value)])


def write_sysctls_here(pairs) -> None:
    """Set per-namespace sysctls (net.*) in the namespace the calling thread is in."""
    for key, value in pairs:
        if not key.startswith("net."):
            raise ValueError(f"{key} is not a per-namespace sysctl")
        with open("/proc/sys/" + key.replace(".", "/"), "w") as f:
            f.write(str(value))


def read_sysctl(name: str, key: str) -> str:
    with entered(name):
        with open("/proc/sys/" + key.replace(".", "/")) as f:
            return f.read().strip()


def inode(name: str) -> int | None:
    try:
        return os.stat(path(name)).st_ino
    except FileNotFoundError:
        return None


def pids_in(names_: Sequence[str]) -> dict[int, str]:
    """Processes whose network namespace is one of ``names_``: pid -> namespace name."""
    wanted = {}
    for n in names_:
        ino = inode(n)
        if ino is not None:
            wanted[ino] = n
    found: dict[int, str] = {}
    if not wanted:
        return found
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            ino = os.stat(f"/proc/{entry}/ns/net").st_ino
        except OSError:
            continue
        if ino in wanted:
            found[int(entry)] = wanted[ino]
    return found


def kill_pids(pids: Sequence[int], timeout: float = 3.0) -> None:
    """SIGTERM, then SIGKILL whatever is still alive after ``timeout`` seconds."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = []
        for pid in pids:
            try:
                os.kill(pid, sig)
                alive.append(pid)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + timeout
        while alive and time.monotonic() < deadline:
            alive = [p for p in alive if _alive(p)]
            if alive:
                time.sleep(0.02)
        if not alive:
            return
        pids = alive


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        if state == "Z":
            try:
                os.waitpid(pid, os.WNOHANG)  # our own child: reap it
            except ChildProcessError:
                pass
            return False
        return True
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def remove(name: str) -> None:
    """Unmount and delete the namespace's name; the kernel frees it once no process holds it."""
    if exists(name):
        _netns.remove(name)


def command(name: str, argv: Sequence[str]) -> list[str]:
    """The argv that runs ``argv`` inside namespace ``name`` (with its own /sys, as users expect)."""
    return ["ip", "netns", "exec", name, *argv]


def run(name: str, argv: Sequence[str], timeout: float | None = None, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(command(name, argv), capture_output=True, text=True, timeout=timeout, **kwargs)


def popen(name: str, argv: Sequence[str], **kwargs) -> subprocess.Popen:
    return subprocess.Popen(command(name, argv), **kwargs)
