"""Crash recovery: remove everything of the project's prefix, and only that.

Finds fabrics by their state directories and by namespaces named ``bp-<name>-*``; stops a live
controller (it tears its fabric down), then kills whatever still lives in those namespaces,
removes the namespaces, any stray link of the prefix in the root namespace, and the state.
Never kills by process name: only recorded controller pids (checked against their start time)
and processes inside the fabric's own namespaces.
"""
from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass, field

from pyroute2 import IPRoute

from emulator.control import state
from emulator.fabric import netns
from emulator.model.plan import prefix_of, PROJECT_PREFIX

_FABRIC_NS = re.compile(r"^" + re.escape(PROJECT_PREFIX) + r"([a-z0-9]{1,12})-")
# bp-probe-* is reserved for throwaway probe namespaces (never a fabric): bp-probe-<pid> of a
# capability probe, bp-probe-dp<pid> of the datapath tests; removed once that pid is gone.
_PROBE_NS = re.compile(r"^" + re.escape(PROJECT_PREFIX) + r"probe-\D*(\d+)$")


@dataclass
class CleanReport:
    fabric: str
    controller: str = "none"  # none | stopped | killed
    namespaces: list[str] = field(default_factory=list)
    processes: int = 0
    root_links: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)


def fabric_names() -> list[str]:
    names = set(state.known_names())
    for ns in netns.names(PROJECT_PREFIX):
        m = _FABRIC_NS.match(ns)
        if m and not ns.startswith(PROJECT_PREFIX + "probe-"):
            names.add(m.group(1))
    return sorted(names)


def health(name: str) -> str | None:
    """None when fabric ``name`` is up with a live controller; else why it is stale."""
    rec = state.read_record(name)
    if rec is None:
        return "namespaces without a controller"
    if not rec.alive():
        return f"its controller (pid {rec.pid}) is gone"
    return None


def healthy_names() -> list[str]:
    return [n for n in fabric_names() if health(n) is None]


def clean(name: str | None = None) -> list[CleanReport]:
    reports = []
    for fabric in [name] if name else fabric_names():
        reports.append(_clean_one(fabric))
    if name is None:
        for ns in netns.names(PROJECT_PREFIX + "probe-"):
            m = _PROBE_NS.match(ns)
            if m and state.process_start_time(int(m.group(1))) is None:
                netns.remove(ns)
    return reports


def _clean_one(name: str) -> CleanReport:
    report = CleanReport(name)
    prefix = prefix_of(name)
    rec = state.read_record(name)
    if rec is not None and rec.alive():
        # A live controller tears its own fabric down on SIGTERM; SIGKILL only if it hangs.
        netns.kill_pids([rec.pid], timeout=20)
        report.controller = "stopped" if state.process_start_time(rec.pid) is None else "killed"
    report.processes = len(netns.pids_in(netns.names(prefix)))
    from emulator.fabric.build import remove_fabric_namespaces
    report.namespaces = remove_fabric_namespaces(prefix)
    with IPRoute() as ipr:
        for link in ipr.get_links():
            ifname = link.get_attr("IFLA_IFNAME") or ""
            if ifname.startswith(prefix):
                ipr.link("del", index=link["index"])
                report.root_links.append(ifname)
    state.remove(name)
    return report


def leftovers(name: str) -> dict:
    """What of fabric ``name`` exists now: for tests and for `clean --check`."""
    prefix = prefix_of(name)
    names = netns.names(prefix)
    with IPRoute() as ipr:
        links = [l.get_attr("IFLA_IFNAME") for l in ipr.get_links()
                 if (l.get_attr("IFLA_IFNAME") or "").startswith(prefix)]
    shells = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    args = f.read().split(b"\0")
            except OSError:
                continue
            if any(a.startswith(f"mininet:{prefix}".encode()) for a in args):
                shells.append(int(entry))
    rec = state.read_record(name)
    return {
        "namespaces": names,
        "processes": sorted(set(netns.pids_in(names)) | set(shells)),
        "root_links": links,
        "controller": rec.pid if rec is not None and rec.alive() else None,
        "state_dir": state.fabric_dir(name).exists(),
    }
