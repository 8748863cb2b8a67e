"""``backplane run scenario``: a workload on a running fabric, a timeline of faults applied to it
by the fabric's controller, and everything recorded on one clock into a run directory.

The timeline starts with the data (the transfer's on_start): each event is sent to the
controller at its time in the real fabric's units, dilated. When the workload ends, the events
still due are applied at their times, every fault still active is restored (the run leaves the
fabric as it found it), and the run waits for the control plane to take restored paths back.
"""
from __future__ import annotations

import platform
import threading
import time
from importlib import metadata
from pathlib import Path

from emulator import errors
from emulator.control import client
from emulator.model import scenario as scenario_mod
from emulator.model.plan import SWITCH_ROLES
from emulator.telemetry import runs, store
from emulator.workload import transfer

# The controller's port samples every this much wall time.
SAMPLE_WALL_S = 0.010
# Beyond the detection time, how long restored faults may take to be noticed (wall s).
SETTLE_SLACK_S = 2.0


def _request(event: scenario_mod.Event, detection_s: float) -> dict:
    """The controller's inject request for ``event``."""
    o = event.options
    if event.kind == "pfc-storm":
        return {"op": "inject", "kind": "pfc-storm", "node": event.target, "ifname": o.get("port"),
                **({"priority": o["priority"]} if "priority" in o else {}), "for_s": o.get("for")}
    names = {"period": "period_s", "rate": "rate_bps", "extra": "extra_m"}
    return {"op": "inject", "kind": event.kind, "target": event.target, "detection_s": detection_s,
            **{names.get(k, k): v for k, v in o.items()}}


class Timeline(threading.Thread):
    """Applies the scenario's events at their times from ``start()``; records each."""

    def __init__(self, name: str, scn: scenario_mod.Scenario, dilation: float) -> None:
        super().__init__(name="scenario-timeline", daemon=True)
        self.fabric, self.scn, self.dilation = name, scn, dilation
        self.t0: float | None = None
        self.applied: list[dict] = []
        self._go = threading.Event()

    def begin(self) -> None:
        self.t0 = time.monotonic()
        self._go.set()

    def run(self) -> None:
        self._go.wait()
        for e in self.scn.events:
            due = self.t0 + e.at_s * self.dilation
            time.sleep(max(0.0, due - time.monotonic()))  # the timeline's own clock, not a wait for state
            rec = {"kind": e.kind, "target": e.target, "at_s": e.at_s, "options": e.options,
                   "applied_at": time.monotonic()}
            try:
                reply = client.request(self.fabric, _request(e, self.scn.detection_s))
                fault = reply.get("fault") or {}
                rec["fault_id"] = fault.get("id") if "id" in fault else None
                if e.kind == "restore":
                    rec["restored"] = [f["id"] for f in fault.get("restored", [])]
            except errors.BackplaneError as err:
                rec["error"] = str(err)
            self.applied.append(rec)


def _settle(name: str, budget_s: float) -> list[dict]:
    """Restore what is still active and wait for the control plane to take it back."""
    faults = client.request(name, {"op": "faults"})["faults"]
    if any(f["restored_at"] is None for f in faults):
        client.request(name, {"op": "inject", "kind": "restore", "target": "all"})
    deadline = time.monotonic() + budget_s
    while True:
        faults = client.request(name, {"op": "faults"})["faults"]
        if all(f["reconverged_at"] is not None for f in faults) or time.monotonic() > deadline:
            return faults
        time.sleep(0.02)


def _path_of(plan) -> dict[str, int]:
    """Each border port onto a long-haul path -> that path's index."""
    return {f"{l.a.node}:{l.a.ifname}" if plan.node(l.a.node).role in SWITCH_ROLES else f"{l.b.node}:{l.b.ifname}":
            l.path for l in plan.links if l.kind == "wan"}


def _versions() -> dict:
    out = {"python": platform.python_version(), "kernel": platform.release()}
    for dist in ("backplane", "pyroute2", "pyarrow", "mininet"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def run(name: str, scn: scenario_mod.Scenario, out_dir: str | Path, timeout: float = 600.0) -> dict:
    """Run ``scn`` on fabric ``name``; write the run to ``out_dir``; return its figures."""
    running = client.running(name)
    plan, fspec = running.plan, running.plan.spec
    if fspec.ecmp.datapath != "ebpf":
        raise errors.UsageError(f"fabric {name!r} runs the kernel datapath: faults and port series need the eBPF one")
    scenario_mod.check_targets(scn, plan)
    client.request(name, {"op": "faults", "prepare": True})
    w = scn.workload
    qps = w.qps or fspec.nic.qps_per_pair
    timeline_thread = Timeline(name, scn, fspec.time.dilation)
    timeline_thread.start()
    result = transfer.run(plan, list(w.srcs), w.dst, w.size, qps, fspec.nic.transport, timeout=timeout,
                          cc=transfer.choose_profile(fspec, None), seed=scn.seed, sample_s=SAMPLE_WALL_S,
                          sampler=lambda: client.request(name, {"op": "sample", "paths": True}), on_start=timeline_thread.begin)
    last = scn.events[-1].at_s * fspec.time.dilation if scn.events else 0.0
    timeline_thread.join(timeout=max(0.0, timeline_thread.t0 + last - time.monotonic()) + 30)
    faults = _settle(name, fspec.time.time(scn.detection_s) + SETTLE_SLACK_S)
    body = result.as_dict()
    tel = body["telemetry"]
    path_of = _path_of(plan)
    rows = runs.tables(fspec.time, timeline_thread.t0, tel["ports"], tel["senders"], path_of,
                       timeline_thread.applied, faults, senders_t0=tel["t0_monotonic"])
    flows = body["flows"]
    manifest = {
        "fabric": name, "scenario": scn.as_dict(), "topology_text": client.request(name, {"op": "plan"})["topology"],
        "time_model": fspec.time.as_dict(), "t0_monotonic": timeline_thread.t0, "versions": _versions(),
        "columns": {k: list(v) for k, v in runs.COLUMNS.items()},
        "result": {"intact": all(f["intact"] for f in flows), "complete": all(f["complete"] for f in flows),
                   "seconds": max(f["started_s"] + f["seconds"] for f in flows) - min(f["started_s"] for f in flows),
                   "goodput_bps": sum(f["goodput_bps"] for f in flows),
                   "retransmits": sum(f["retransmits"] for f in flows), "timeouts": sum(f["timeouts"] for f in flows),
                   "ports_error": tel.get("ports_error")},
    }
    out = store.write(out_dir, manifest, rows)
    manifest, rows = store.read(out)
    figures = runs.figures(manifest, rows)
    runs.plot(manifest, rows, out / "timeline.png")
    return {"run_dir": str(out), "plot": str(out / "timeline.png"), "time_model": manifest["time_model"], **figures}


def record_collective(name: str, body: dict, out_dir: str | Path) -> dict:
    """Write a collective (``run collective --out``: its record ``body``, with the port readings
    taken through its runs) to the run store, as a run without events; return where."""
    running = client.running(name)
    plan, fspec = running.plan, running.plan.spec
    tel = body.get("telemetry") or {}
    t0 = tel.get("t0_monotonic")
    if t0 is None:
        raise errors.MeasurementError("the collective ended before its runs started: nothing to record")
    path_of = _path_of(plan)
    rows = runs.tables(fspec.time, t0, tel.get("ports", []), {}, path_of, [], [])
    record = {k: v for k, v in body.items() if k != "telemetry"}
    manifest = {
        "fabric": name, "workload": "collective", "collective": record,
        "scenario": {"name": f"{record['op']} over {len(record['hosts'])} ranks",
                     "description": f"profile {record.get('profile') or 'none'}, {record['transport']}, "
                                    f"{record['qps']} QPs per link"},
        "topology_text": client.request(name, {"op": "plan"})["topology"], "time_model": fspec.time.as_dict(),
        "t0_monotonic": t0, "versions": _versions(), "columns": {k: list(v) for k, v in runs.COLUMNS.items()},
        "result": {"op": record["op"], "intact": record["intact"], "complete": record["complete"],
                   "seconds": record["time_s"], "goodput_bps": record["algbw_bps"], "busbw_bps": record["busbw_bps"],
                   "retransmits": record["retransmits"], "timeouts": record["timeouts"],
                   "ports_error": tel.get("ports_error")},
    }
    out = store.write(out_dir, manifest, rows)
    manifest, rows = store.read(out)
    runs.plot(manifest, rows, out / "timeline.png")
    return {"run_dir": str(out), "plot": str(out / "timeline.png"), "ports_rows": len(rows["ports"])}
