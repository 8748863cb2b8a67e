"""Figures and plots from a transfer's telemetry: per-port queue depth percentiles, marks, drops
and utilisation; per-flow rates and Jain's fairness index over time; a PNG of rate and queue.

Pure: it reads the dict ``run transfer --json`` prints (``TransferResult.as_dict()``) and
returns data; only ``plot`` writes a file.
"""
from __future__ import annotations

from pathlib import Path

from emulator.model.timemodel import TimeModel
from emulator.stats import jain, percentile
from emulator.telemetry import fidelity as fidelity_mod, timeline

FAIR = 0.95  # Jain's index at or above which flows count as sharing fairly


def _window(result: dict) -> tuple[float, float]:
    """The span every sender was sending, on the telemetry clock (if they never all sent at
    once, the span any of them was)."""
    flows = result["flows"]
    begin, end = max(f["started_s"] for f in flows), min(f["started_s"] + f["seconds"] for f in flows)
    if end <= begin:
        begin, end = min(f["started_s"] for f in flows), max(f["started_s"] + f["seconds"] for f in flows)
    return begin, end


def ports(result: dict) -> list[dict]:
    """Per switch port that queued, marked or dropped during the transfer: depth percentiles
    over the samples taken while every sender ran, marks, drops and utilisation."""
    tel = result["telemetry"]
    readings = tel.get("ports") or []
    if len(readings) < 2:
        return []
    t0 = tel["t0_monotonic"]
    begin, end = _window(result)
    meta = tel.get("ports_meta", {})
    first, last = readings[0], readings[-1]
    inside = [r for r in readings if begin <= r["t"] - t0 <= end] or readings
    out = []
    for i, row in enumerate(first["ports"]):
        name = row["port"]
        depths = [r["ports"][i]["depth"] for r in inside]
        marks = last["ports"][i]["ecn_marks"] - row["ecn_marks"]
        drops = last["ports"][i]["drops"] - row["drops"]
        if not (marks or drops or max(depths) > 0):
            continue
        a, b = inside[0], inside[-1]
        span = b["t"] - a["t"]
        rate = meta.get(name, {}).get("rate_bps")
        util = ((b["ports"][i]["deq_bytes"] - a["ports"][i]["deq_bytes"]) * 8 / span / rate) if rate and span > 0 else None
        out.append({"port": name, "samples": len(depths), "depth_p50": percentile(depths, 50),
                    "depth_p90": percentile(depths, 90), "depth_p99": percentile(depths, 99), "depth_max": max(depths),
                    "ecn_marks": marks, "buffer_drops": drops, "utilisation": util, "rate_bps": rate,
                    "buffer_bytes": meta.get(name, {}).get("buffer_bytes")})
    return sorted(out, key=lambda p: -(p["utilisation"] or 0) - p["depth_p50"] / 1e9)


def reaction(result: dict) -> dict | None:
    """The senders' share of the feedback delay: each sending NIC's median time from a CNP's
    arrival to the rate cut, their median, and the worst p90 and max (None without CNPs).
    Each NIC summarises its own samples; the raw samples stay in the NIC processes."""
    sums = [s["nic"]["cnp_reaction_s"] for s in result["senders"] if s["nic"].get("cnp_reaction_s")]
    if not sums:
        return None
    p50s = sorted(x["p50"] for x in sums)
    return {"p50_per_sender": p50s, "p50_median": p50s[len(p50s) // 2],
            "p90_max": max(x["p90"] for x in sums), "max": max(x["max"] for x in sums)}


def time_model(result: dict) -> TimeModel:
    return TimeModel.from_dict(result["time_model"])


def fidelity(result: dict, machine: dict | None) -> dict:
    """The run's fidelity verdict: the time model's granularity against what DCQCN and ECN work
    with, the NICs' own lateness against the feedback loop the topology models, and the
    fabric's guard over the run (``machine``: the controller's verdict since the run's start:
    steal, softirq, drops outside the model, every busy port's dequeue pacing)."""
    tm = time_model(result)
    sc = result["scenario"]
    cc = sc.get("dcqcn")
    ecn = result["telemetry"].get("ecn") or {}
    findings = fidelity_mod.granularity(
        tm, sc["frame_bytes"], sc["host_rate_bps"],
        (ecn["emulated_kmin"], ecn["emulated_kmax"]) if ecn and cc else None, cc)
    if cc:
        late = [s["nic"].get("reaction_late_s") for s in result["senders"] if s["nic"].get("reaction_late_s")]
        react = {"p50": max(x["p50"] for x in late), "p90": max(x["p90"] for x in late)} if late else None
        cnp = result["receiver"]["nic"].get("cnp_late_s")
        loop = sc["intra_dc_rtt_s"] + cc["cnp_delay_s"] + cc["reaction_delay_s"]
        findings.append(fidelity_mod.feedback(tm, cnp, react, loop))
    if sc.get("window") == "none":
        nic = fidelity_mod.nic_pacing(tm, result["telemetry"].get("senders") or {}, *_window(result))
        if nic is not None:
            findings.append(nic)
    for p in (machine or {}).get("pacing", []):
        findings.append(fidelity_mod.Finding(**p))
    limits = [x for x in (machine or {}).get("limits", []) if not x.startswith("NOT FAITHFUL")]
    out = fidelity_mod.verdict(findings, limits)
    if machine is None:
        out["machine_limits"].append("the fabric's guard was not asked (no eBPF datapath or no controller)")
        out["faithful"] = False
    return out


def _sent(tel: dict) -> list[int]:
    """A sender's bytes sent by each sample, its QPs summed."""
    return [sum(q["tx_bytes"][k] for q in tel["qps"].values()) for k in range(len(tel["t"]))]


def flow_rates(result: dict) -> dict[str, tuple[list[float], list[float]]]:
    """Each sender's rate (bit/s, its QPs summed) per sample interval: host -> (interval ends,
    rates); each sender samples on its own ticks."""
    out = {}
    for host, tel in (result["telemetry"].get("senders") or {}).items():
        t, total = tel["t"], _sent(tel)
        out[host] = (t[1:], [(total[k] - total[k - 1]) * 8 / (t[k] - t[k - 1]) if t[k] > t[k - 1] else 0.0
                             for k in range(1, len(t))])
    return out


def fairness(result: dict, window_s: float) -> dict:
    """Jain's index of the senders' rates over windows of ``window_s`` while all of them ran,
    and the time from the last sender's start until the index reached FAIR and stayed there."""
    senders = result["telemetry"].get("senders") or {}
    if len(senders) < 2:
        return {}
    begin, end = _window(result)
    grid = [begin + k * window_s for k in range(int((end - begin) // window_s) + 1)]
    sent: dict[str, list[float]] = {}
    for host, tel in senders.items():
        sent[host] = [_interp(tel["t"], _sent(tel), g) for g in grid]
    index = []
    for k in range(1, len(grid)):
        index.append(jain([(sent[h][k] - sent[h][k - 1]) for h in sent]))
    settled = None
    for k in range(len(index)):
        if all(j >= FAIR for j in index[k:]):
            settled = k * window_s
            break
    whole = jain([sent[h][-1] - sent[h][0] for h in sent]) if len(grid) > 1 else None
    return {"window_s": window_s, "jain": index, "jain_whole": whole, "jain_min": min(index) if index else None,
            "fair_after_s": settled, "span_s": end - begin}


def _interp(t: list[float], v: list[float], x: float) -> float:
    if not t:
        return 0.0
    if x <= t[0]:
        return v[0]
    for k in range(1, len(t)):
        if x <= t[k]:
            f = (x - t[k - 1]) / (t[k] - t[k - 1]) if t[k] > t[k - 1] else 1.0
            return v[k - 1] + f * (v[k] - v[k - 1])
    return v[-1]


def plot(result: dict, path: str | Path) -> Path:
    """A PNG in the real fabric's units: each sender QP's DCQCN rate and each sender's measured
    rate over time, and the depth of the busiest switch queues with the ECN thresholds; with
    PFC, when each port that paused was paused and the watchdog's storms (``result["pfc"]``);
    the title carries the time model (scale, dilation, granularity)."""
    import matplotlib

    matplotlib.use("Agg")  # no display: files only
    import matplotlib.pyplot as plt

    tm = time_model(result)
    tel = result["telemetry"]
    t_real = lambda ts: [tm.real_time(t) * 1e3 for t in ts]  # noqa: E731 - wall s -> real ms
    gbps = lambda bps: tm.real_rate(bps) / 1e9  # noqa: E731
    t0 = tel["t0_monotonic"]
    readings = tel.get("ports") or []
    # With PFC, a fourth panel: when each port that paused was paused, and the watchdog's storms.
    paused = [p["port"] for p in timeline.summary({"readings": readings}) if p["paused_share"] > 0]
    fig, axes = plt.subplots(4 if paused else 3, 1, figsize=(10, 11 if paused else 9), sharex=True)
    top, mid, bottom = axes[:3]
    for host, s in (tel.get("senders") or {}).items():
        for qpn, q in s["qps"].items():
            top.plot(t_real(s["t"]), [gbps(r) for r in q["rate_bps"]], lw=0.8, label=f"{host} QP {int(qpn):#x}")
    top.set_ylabel("DCQCN rate Rc,\nmean per sample (Gb/s)")
    top.set_title(f"{result['src']} -> {result['dst']}: {result['rate_control']}, {result['transport']}\n"
                  f"scale {tm.scale:g}, dilation {tm.name}, granularity x{tm.distortion:g}; real units",
                  fontsize=9)
    for host, (times, r) in flow_rates(result).items():
        mid.plot(t_real(times), [gbps(x) for x in r], lw=0.8, label=host)
    mid.set_ylabel("sent (Gb/s)")
    busiest = ports(result)[:3]
    names = [r["port"] for r in readings[0]["ports"]] if readings else []
    for p in busiest:
        i = names.index(p["port"])
        bottom.plot(t_real([r["t"] - t0 for r in readings]), [tm.real_size(r["ports"][i]["depth"]) / 1e3 for r in readings],
                    lw=0.8, label=p["port"])
    ecn = tel.get("ecn") or {}
    for key, style in (("kmin", ":"), ("kmax", "--")):
        size = ecn.get(key)
        if size:
            bottom.axhline(size / 1e3, ls=style, lw=0.8, color="grey", label=f"{key.capitalize()} {size / 1e3:g} KB")
    bottom.set_ylabel("queue depth (KB)")
    if paused:
        pfc = result.get("pfc") or {}
        timeline.draw_pauses(axes[3], readings, paused[:timeline.MAX_PLOTTED], t0,
                             lambda wall: tm.real_time(wall) * 1e3, pfc.get("storms") or [], pfc.get("injected") or [])
    return timeline.save(fig, axes, path)
