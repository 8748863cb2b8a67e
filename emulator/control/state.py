"""Where a fabric's controller leaves its traces: /run/backplane/<name>/.

``controller.json`` records the controller's pid and start time (so a recycled pid is never
mistaken for it), ``control.sock`` is its Unix socket, ``controller.log`` its log. Everything
here is removed by ``down`` and by ``clean``.
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from emulator.model.plan import check_name

STATE_ROOT = Path(os.environ.get("BACKPLANE_STATE_DIR", "/run/backplane"))


def fabric_dir(name: str) -> Path:
    return STATE_ROOT / check_name(name)


def socket_path(name: str) -> Path:
    return fabric_dir(name) / "control.sock"


def log_path(name: str) -> Path:
    return fabric_dir(name) / "controller.log"


def process_start_time(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat: the process's start time in clock ticks since boot."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _zombie(pid: int) -> bool:
    """An exited process not yet reaped by its parent (the controller's is init)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return True


@dataclass(frozen=True)
class ControllerRecord:
    pid: int
    start_time: int
    topology: str
    wan_delay: bool
    dilation: str | None = None  # `up --dilation` as given, replacing the topology's (None: the file's)
    scale: float | None = None  # `up --scale`, likewise

    def alive(self) -> bool:
        return process_start_time(self.pid) == self.start_time and not _zombie(self.pid)


def write_record(name: str, topology: str, wan_delay: bool, dilation: str | None = None,
                 scale: float | None = None) -> ControllerRecord:
    d = fabric_dir(name)
    d.mkdir(parents=True, exist_ok=True)
    pid = os.getpid()
    rec = ControllerRecord(pid, process_start_time(pid) or 0, topology, wan_delay, dilation, scale)
    tmp = d / "controller.json.tmp"
    tmp.write_text(json.dumps(asdict(rec)))
    tmp.rename(d / "controller.json")
    return rec


def read_record(name: str) -> ControllerRecord | None:
    try:
        return ControllerRecord(**json.loads((fabric_dir(name) / "controller.json").read_text()))
    except (OSError, ValueError, TypeError):
        return None


def known_names() -> list[str]:
    try:
        return sorted(p.name for p in STATE_ROOT.iterdir() if p.is_dir())
    except FileNotFoundError:
        return []


def remove(name: str, keep_log: bool = False) -> None:
    """Remove the fabric's state; ``keep_log`` leaves the log of a failed start for reading."""
    d = fabric_dir(name)
    if not keep_log:
        shutil.rmtree(d, ignore_errors=True)
        return
    for leftover in ("controller.json", "control.sock", "controller.json.tmp"):
        try:
            (d / leftover).unlink()
        except FileNotFoundError:
            pass
