"""A scenario run's tables, figures, state at a moment, and timeline plot.

Pure: ``tables`` turns what a run gathered (the transfer's telemetry, the port samples, the
fault agent's timelines) into the store's rows (emulator/telemetry/store.py); the rest read a
stored run back (manifest and rows) and never touch a fabric, so any run is re-read and
re-plotted later.
"""
from __future__ import annotations

import json
from pathlib import Path

from emulator.model.timemodel import TimeModel
from emulator.telemetry import timeline

# Columns of each table, so an empty one still has them (a run with no events).
COLUMNS = {
    "ports": ("t_s", "t_real_s", "port", "depth", "deq_bytes", "ecn_marks", "drops", "paused", "pauses_sent",
              "lossless_drops", "down_drops"),
    "paths": ("t_s", "t_real_s", "path", "port", "deq_bytes", "depth", "drops", "down_drops", "share",
              "fiber_packets"),
    "nics": ("t_s", "t_real_s", "host", "qpn", "rate_bps", "tx_bytes", "retransmits", "cnps_received", "cnps_sent",
             "ce_received"),
    "events": ("id", "kind", "target", "at_s", "applied_s", "took_effect_s", "noticed_s", "converged_s", "restored_s",
               "reconverged_s", "ports", "options", "error"),
}
# Faults whose time stamps are moments on the run's clock (monotonic), turned into *_s columns.
_STAMPS = (("took_effect_at", "took_effect_s"), ("noticed_at", "noticed_s"), ("converged_at", "converged_s"),
           ("restored_at", "restored_s"), ("reconverged_at", "reconverged_s"))


def tables(tm: TimeModel, t0: float, readings: list[dict], senders: dict, path_of: dict[str, int],
           applied: list[dict], faults: list[dict], senders_t0: float | None = None) -> dict[str, list[dict]]:
    """The store's rows, every time in seconds from ``t0`` (monotonic: the timeline's start).
    ``readings``: the controller's port samples (monotonic ``t``); ``senders``: the transfer's
    per-host QP series (seconds from ``senders_t0``, the transfer's own start before its
    workers came up; ``t0`` if None); ``path_of``: border
    port -> long-haul path; ``applied``: each scenario event as the runner applied it (its
    ``at_s``, ``applied_at``, the fault id it made, or its error); ``faults``: the agent's."""
    def when(t_s: float) -> dict:
        return {"t_s": t_s, "t_real_s": tm.real_time(t_s)}

    ports, paths = [], []
    for r in readings:
        at = when(r["t"] - t0)
        seen = {q["port"]: q for q in r.get("paths", [])}  # shares and the fibers' counts, when sampled
        for p in r["ports"]:
            ports.append({**at, **{k: p.get(k, 0) for k in COLUMNS["ports"][2:]}})
            if p["port"] in path_of:
                q = seen.get(p["port"], {})
                paths.append({**at, "path": path_of[p["port"]], "port": p["port"], "deq_bytes": p["deq_bytes"],
                              "depth": p["depth"], "drops": p["drops"], "down_drops": p.get("down_drops", 0),
                              "share": q.get("share"), "fiber_packets": q.get("fiber_packets")})
    nics = []
    shift = (senders_t0 - t0) if senders_t0 is not None else 0.0
    for host, s in senders.items():
        for qpn, q in s["qps"].items():
            for k, t in enumerate(s["t"]):
                nics.append({**when(t + shift), "host": host, "qpn": int(qpn),
                             **{c: q[c][k] if c in q else 0 for c in COLUMNS["nics"][4:]}})
    by_id = {f["id"]: f for f in faults}
    events = []
    for i, a in enumerate(applied):
        f = by_id.get(a.get("fault_id"), {})
        row = {"id": i, "kind": a["kind"], "target": a["target"], "at_s": a["at_s"],
               "applied_s": a["applied_at"] - t0 if a.get("applied_at") else None,
               "ports": ",".join(f.get("ports", [])), "options": json.dumps(a.get("options", {})),
               "error": a.get("error") or ""}
        for stamp, col in _STAMPS:
            row[col] = f[stamp] - t0 if f.get(stamp) is not None else None
        events.append(row)
    return {"ports": ports, "paths": paths, "nics": nics, "events": events}


def _tm(manifest: dict) -> TimeModel:
    return TimeModel.from_dict(manifest["time_model"])


def path_rates(manifest: dict, rows: dict) -> dict[int, tuple[list[float], list[float]]]:
    """Per long-haul path, both borders summed: (real ms, real Gb/s) between samples."""
    tm = _tm(manifest)
    by_t: dict[int, dict[float, int]] = {}
    for r in rows["paths"]:
        by_t.setdefault(r["path"], {}).setdefault(r["t_s"], 0)
        by_t[r["path"]][r["t_s"]] += r["deq_bytes"]
    out = {}
    for path, series in sorted(by_t.items()):
        ts = sorted(series)
        xs, ys = [], []
        for a, b in zip(ts, ts[1:]):
            if b > a:
                xs.append(tm.real_time(b) * 1e3)
                ys.append(tm.real_rate((series[b] - series[a]) * 8 / (b - a)) / 1e9)
        out[path] = (xs, ys)
    return out


def _nic_totals(rows: dict, column: str) -> tuple[list[float], list[float]]:
    """A NIC column summed over every QP, per sample time (wall s from the start)."""
    by_t: dict[float, float] = {}
    for r in rows["nics"]:
        by_t[r["t_s"]] = by_t.get(r["t_s"], 0) + (r[column] or 0)
    ts = sorted(by_t)
    return ts, [by_t[t] for t in ts]


def figures(manifest: dict, rows: dict) -> dict:
    """Per event, in the real fabric's time: when it took effect after the timeline said, the
    detection (took effect to noticed), the convergence (noticed to the ECMP groups written),
    the time lost (took effect to converged), and for a path taken down, the loss window the
    samples saw: from the cut to the end of the last sample in which its borders dropped
    traffic sent into it (``drop_link_down``), which ECMP's convergence ends, and that sample
    interval's length (the loss ended within it)."""
    tm = _tm(manifest)
    real = lambda s: None if s is None else tm.real_time(s)  # noqa: E731
    out = []
    for e in rows["events"]:
        f = {"kind": e["kind"], "target": e["target"], "at_s": e["at_s"], "error": e["error"] or None,
             "applied_late_s": real(e["applied_s"]) - e["at_s"] if e["applied_s"] is not None else None}
        if e["took_effect_s"] is not None and e["converged_s"] is not None:
            f["detection_s"] = real(e["noticed_s"] - e["took_effect_s"])
            f["convergence_s"] = real(e["converged_s"] - e["noticed_s"])
            f["time_lost_s"] = real(e["converged_s"] - e["took_effect_s"])
            path = _path_index(e["target"])
            if path is not None:
                end = e["restored_s"] if e["restored_s"] is not None else float("inf")
                lost = [r for r in _grew(rows, path, "down_drops") if e["took_effect_s"] < r["t_s"] <= end]
                f["loss_window_s"], f["loss_window_step_s"] = 0.0, None
                if lost:
                    last = max(lost, key=lambda r: r["t_s"])
                    f["loss_window_s"] = real(last["t_s"] - e["took_effect_s"])
                    # The samples bound the loss's end to the interval before that sample: its
                    # length is the figure's resolution (the sampler spaces readings further when slow).
                    f["loss_window_step_s"] = real(last["t_s"] - last["since_s"])
                f["lost_packets"] = sum(r["by"] for r in lost)
                # From convergence: what the fiber held when cut (its delay line) has left it by then.
                f["fiber_packets_while_withdrawn"] = _fiber_packets(rows, path, e["converged_s"], end)
        if e["converged_s"] is not None and e["restored_s"] is not None and e["reconverged_s"] is not None:
            f["back_in_ecmp_after_s"] = real(e["reconverged_s"] - e["restored_s"])
        out.append(f)
    return {"events": out, "result": manifest.get("result", {})}


def _fiber_packets(rows: dict, path: int, start: float, end: float) -> int | None:
    """What the fiber of ``path`` carried on (its own kernel counters, both directions) between
    the first sample after ``start`` that read them and the last one before ``end``; None
    unless the window holds two readings of each direction (a run recorded without them)."""
    counts: dict[str, list[int]] = {}
    for r in sorted((r for r in rows["paths"] if r["path"] == path and start < r["t_s"] < end),
                    key=lambda r: r["t_s"]):
        counts.setdefault(r["port"], [])
        if r.get("fiber_packets") is not None:
            counts[r["port"]].append(r["fiber_packets"])
    if not counts or any(len(c) < 2 for c in counts.values()):
        return None
    return sum(c[-1] - c[0] for c in counts.values())


def _path_index(target: str) -> int | None:
    return int(target[3:]) if target.startswith("wan") and target[3:].isdigit() else None


def _grew(rows: dict, path: int, column: str) -> list[dict]:
    """The samples at which ``column`` of a border port onto ``path`` grew since the sample
    before, each with ``by`` how much and ``since_s`` that sample's time."""
    last: dict[str, dict] = {}
    out = []
    for r in sorted((r for r in rows["paths"] if r["path"] == path), key=lambda r: r["t_s"]):
        before = last.get(r["port"])
        if before is not None and r[column] > before[column]:
            out.append({**r, "by": r[column] - before[column], "since_s": before["t_s"]})
        last[r["port"]] = r
    return out


def state_at(manifest: dict, rows: dict, t_real_s: float) -> dict:
    """The fabric at real time T from the start: each path up or down and in ECMP or
    withdrawn, its share of the ECMP group, each port's queue and paused priorities at the last
    sample at or before T, and the rates over the interval that ends there."""
    tm = _tm(manifest)
    t = tm.time(t_real_s)

    def active(e: dict, start: str, end: str) -> bool:
        return e[start] is not None and e[start] <= t and (e[end] is None or t < e[end])

    down_ports = {p for e in rows["events"] if active(e, "took_effect_s", "restored_s") for p in e["ports"].split(",") if p}
    withdrawn = {p for e in rows["events"] if active(e, "converged_s", "reconverged_s")
                 for p in e["ports"].split(",") if p}
    times = sorted({r["t_s"] for r in rows["ports"]})
    now = max((x for x in times if x <= t), default=None)
    before = max((x for x in times if now is not None and x < now), default=None)
    ports = {r["port"]: r for r in rows["ports"] if r["t_s"] == now}
    prev = {r["port"]: r for r in rows["ports"] if r["t_s"] == before}
    paths: dict[int, dict] = {}
    for r in rows["paths"]:
        if r["t_s"] != now:
            continue
        p = paths.setdefault(r["path"], {"path": r["path"], "up": True, "in_ecmp": True, "rate_bps": 0.0,
                                         "shares": []})
        p["up"] &= r["port"] not in down_ports
        p["in_ecmp"] &= r["port"] not in withdrawn and r.get("share") != 0
        if r.get("share") is not None:
            p["shares"].append(r["share"])
        if r["port"] in prev and now > before:
            p["rate_bps"] += tm.real_rate((r["deq_bytes"] - prev[r["port"]]["deq_bytes"]) * 8 / (now - before))
    members = sum(1 for p in paths.values() if p["in_ecmp"]) or 1
    # A group written between the sample and the moment asked for (a withdrawal or a return
    # converged meanwhile) makes the sample's shares stale: the sampler's readings are spaced.
    regrouped = any(now is not None and e[k] is not None and now < e[k] <= t
                    for e in rows["events"] for k in ("converged_s", "reconverged_s"))
    for p in paths.values():
        # Recorded: the borders' shares as their groups held them (weights applied), averaged
        # over the path's two ends. A run stored without them, or with them stale: equal shares
        # of what is in ECMP.
        recorded = p.pop("shares")
        shares = [] if regrouped else recorded
        p["ecmp_share"] = sum(shares) / len(shares) if shares else (1 / members if p["in_ecmp"] else 0.0)
    queues = [{"port": name, "depth_bytes": tm.real_size(r["depth"]),
               "paused_priorities": [q for q in range(8) if r["paused"] >> q & 1]}
              for name, r in sorted(ports.items()) if r["depth"] or r["paused"]]
    nic_t, nic_tx = _nic_totals(rows, "tx_bytes")
    k = max((i for i, x in enumerate(nic_t) if x <= t), default=None)
    nic_rate = (tm.real_rate((nic_tx[k] - nic_tx[k - 1]) * 8 / (nic_t[k] - nic_t[k - 1]))
                if k and nic_t[k] > nic_t[k - 1] else None)
    return {"t_real_s": t_real_s, "sample_t_real_s": tm.real_time(now) if now is not None else None,
            "paths": [paths[i] for i in sorted(paths)], "queues": queues, "senders_rate_bps": nic_rate,
            "ports_down": sorted(down_ports), "withdrawn": sorted(withdrawn)}


def plot(manifest: dict, rows: dict, path: str | Path) -> Path:
    """A PNG timeline in the real fabric's units: per-path throughput, the deepest queues,
    retransmissions and CNPs per sample, with every event marked."""
    import matplotlib

    matplotlib.use("Agg")  # no display: files only
    import matplotlib.pyplot as plt

    tm = _tm(manifest)
    ms = lambda wall: tm.real_time(wall) * 1e3  # noqa: E731
    fig, axes = plt.subplots(3, 1, figsize=(10, 9), sharex=True)
    top, mid, bottom = axes
    for p, (xs, ys) in path_rates(manifest, rows).items():
        top.plot(xs, ys, lw=0.8, label=f"wan{p}")
    top.set_ylabel("per path (Gb/s)")
    sc = manifest.get("scenario", {})
    top.set_title(f"{sc.get('name', '')}: {sc.get('description', '')}\nscale {tm.scale:g}, dilation {tm.name}; "
                  "real units", fontsize=9)
    deepest: dict[str, int] = {}
    for r in rows["ports"]:
        deepest[r["port"]] = max(deepest.get(r["port"], 0), r["depth"])
    for name in sorted(deepest, key=lambda n: -deepest[n])[:4]:
        if not deepest[name]:
            continue
        pts = [r for r in rows["ports"] if r["port"] == name]
        mid.plot([ms(r["t_s"]) for r in pts], [tm.real_size(r["depth"]) / 1e3 for r in pts], lw=0.8, label=name)
    mid.set_ylabel("queue depth (KB)")
    for column, style in (("retransmits", "-"), ("cnps_received", "--")):
        ts, totals = _nic_totals(rows, column)
        bottom.plot([ms(t) for t in ts[1:]], [b - a for a, b in zip(totals, totals[1:])], style, lw=0.8,
                    label=f"{column.replace('_', ' ')} per sample")
    bottom.set_ylabel("packets")
    for e in rows["events"]:
        for col, color in (("took_effect_s", "red"), ("converged_s", "orange"), ("restored_s", "green")):
            if e[col] is not None:
                for ax in axes:
                    ax.axvline(ms(e[col]), color=color, lw=0.7, ls=":")
                top.annotate(f"{e['kind']} {e['target']}" if col == "took_effect_s" else col.split("_")[0],
                             (ms(e[col]), 1), xycoords=("data", "axes fraction"), fontsize=6, rotation=90,
                             va="top", color=color)
    return timeline.save(fig, axes, path)
