"""Figures and plots from a transfer's telemetry: per-port queue depth percentiles, marks, drops
and utilisation; per-flow rates and Jain's fairness index over time; a PNG of rate and queue.

Pure: it reads the dict ``run transfer --json`` prints (``TransferResult.as_dict()``) and
returns data; only ``plot`` writes a file.
"""
from __future__ import annotations

import math
from pathlib import Path

FAIR = 0.95  # Jain's index at or above which flows count as sharing fairly


def jain(xs: list[float]) -> float:
    """Jain's fairness index: (sum x)^2 / (n sum x^2); 1 when all are equal, 1/n when one has all."""
    xs = list(xs)
    sq = sum(x * x for x in xs)
    return (sum(xs) ** 2) / (len(xs) * sq) if xs and sq > 0 else 1.0


def percentile(xs: list[float], q: float) -> float:
    """The nearest-rank percentile (q in 0..100) of ``xs``."""
    s = sorted(xs)
    if not s:
        return math.nan
    return s[max(0, min(len(s) - 1, math.ceil(q / 100 * len(s)) - 1))]


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
        name = row[0]
        depths = [r["ports"][i][1] for r in inside]
        marks = last["ports"][i][3] - row[3]
        drops = last["ports"][i][4] - row[4]
        if not (marks or drops or max(depths) > 0):
            continue
        a, b = inside[0], inside[-1]
        span = b["t"] - a["t"]
        rate = meta.get(name, {}).get("rate_bps")
        util = ((b["ports"][i][2] - a["ports"][i][2]) * 8 / span / rate) if rate and span > 0 else None
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


def _sent(tel: dict) -> list[int]:
    """A sender's bytes sent by each sample, its QPs summed."""
    return [sum(q["tx_bytes"][k] for q in tel["qps"].values()) for k in range(len(tel["t"]))]


def flow_rates(result: dict) -> tuple[list[float], dict[str, list[float]]]:
    """Each sender's rate (bit/s, its QPs summed) per sample interval: (interval ends, rates)."""
    senders = result["telemetry"].get("senders") or {}
    series: dict[str, list[float]] = {}
    times: list[float] = []
    for host, tel in senders.items():
        t, total = tel["t"], _sent(tel)
        series[host] = [(total[k] - total[k - 1]) * 8 / (t[k] - t[k - 1]) if t[k] > t[k - 1] else 0.0
                        for k in range(1, len(t))]
        times = times or t[1:]
    return times, series


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
    """A PNG: each sender QP's DCQCN rate and each sender's measured rate over time, and the
    depth of the busiest switch queues with the ECN thresholds."""
    import matplotlib

    matplotlib.use("Agg")  # no display: files only
    import matplotlib.pyplot as plt

    tel = result["telemetry"]
    fig, (top, mid, bottom) = plt.subplots(3, 1, figsize=(10, 9), sharex=True)
    for host, s in (tel.get("senders") or {}).items():
        for qpn, q in s["qps"].items():
            top.plot(s["t"], [r / 1e6 for r in q["rate_bps"]], lw=0.8, label=f"{host} QP {int(qpn):#x}")
    top.set_ylabel("DCQCN rate Rc,\nmean per sample (Mb/s)")
    top.set_title(f"{result['src']} -> {result['dst']}: {result['rate_control']}, {result['transport']}")
    times, rates = flow_rates(result)
    for host, r in rates.items():
        mid.plot(times[:len(r)], [x / 1e6 for x in r], lw=0.8, label=host)
    mid.set_ylabel("sent (Mb/s)")
    t0 = tel["t0_monotonic"]
    readings = tel.get("ports") or []
    busiest = ports(result)[:3]
    names = [r[0] for r in readings[0]["ports"]] if readings else []
    for p in busiest:
        i = names.index(p["port"])
        bottom.plot([r["t"] - t0 for r in readings], [r["ports"][i][1] / 1e3 for r in readings], lw=0.8, label=p["port"])
    ecn = tel.get("ecn") or {}
    for key, style in (("kmin", ":"), ("kmax", "--")):
        size = ecn.get(f"emulated_{key}")
        if size:
            bottom.axhline(size / 1e3, ls=style, lw=0.8, color="grey", label=f"{key.capitalize()} {size / 1e3:g} KB")
    bottom.set_ylabel("queue depth (KB)")
    bottom.set_xlabel("time (s)")
    for ax in (top, mid, bottom):
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=6, loc="upper right", ncol=2)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
