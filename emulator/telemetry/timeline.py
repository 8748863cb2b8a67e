"""A fabric's switch ports over time, from the controller's samples: what each port moved, how
deep it queued, when PFC held its egress paused, and the watchdog's storms on the same clock.

Pure: it reads a recording (``backplane record --json``: samples, the PFC agent's storms and
injections, the time model) and returns data; only ``plot`` and ``draw_pauses`` draw.
"""
from __future__ import annotations

from pathlib import Path

from emulator.model.timemodel import TimeModel

# Ports drawn when none are named: the ones that paused longest, then moved most.
MAX_PLOTTED = 8


def paused_spans(readings: list[dict], port: str, t0: float) -> list[tuple[float, float]]:
    """The wall spans (seconds from t0) over which ``port``'s egress was paused at any
    priority: from the first sample that saw it paused to the first that saw it open (or the
    last sample)."""
    spans, start = [], None
    for r in readings:
        row = next((p for p in r["ports"] if p["port"] == port), None)
        on = bool(row and row.get("paused"))
        t = r["t"] - t0
        if on and start is None:
            start = t
        elif not on and start is not None:
            spans.append((start, t))
            start = None
    if start is not None:
        spans.append((start, readings[-1]["t"] - t0))
    return spans


def summary(recording: dict) -> list[dict]:
    """Per switch port that moved, queued, paused or dropped while recorded: bytes moved and
    the mean rate, depth at the end and its peak, the share of the recording it sat paused,
    PFC frames it sent and lossless packets dropped. Paused longest first."""
    readings = recording["readings"]
    if len(readings) < 2:
        return []
    t0 = readings[0]["t"]
    span = readings[-1]["t"] - t0
    first, last = readings[0]["ports"], readings[-1]["ports"]
    out = []
    for i, row in enumerate(first):
        name = row["port"]
        end = last[i]
        moved = end["deq_bytes"] - row["deq_bytes"]
        depths = [r["ports"][i]["depth"] for r in readings]
        paused = sum(b - a for a, b in paused_spans(readings, name, t0))
        sent = end.get("pauses_sent", 0) - row.get("pauses_sent", 0)
        lost = (end.get("lossless_drops", 0) - row.get("lossless_drops", 0)) + (end["drops"] - row["drops"])
        if not (moved or max(depths) or paused or sent or lost):
            continue
        out.append({"port": name, "moved_bytes": moved, "rate_bps": moved * 8 / span if span > 0 else 0.0,
                    "depth_end": end["depth"], "depth_max": max(depths),
                    "paused_share": paused / span if span > 0 else 0.0, "pauses_sent": sent, "drops": lost})
    return sorted(out, key=lambda p: (-p["paused_share"], -p["moved_bytes"]))


def chosen(recording: dict, ports: list[str] | None = None) -> list[str]:
    """The ports a plot draws: those named, else the busiest MAX_PLOTTED of ``summary``."""
    if ports:
        return list(ports)
    return [p["port"] for p in summary(recording)[:MAX_PLOTTED]]


def draw_pauses(ax, readings: list[dict], ports: list[str], t0: float, to_x, storms: list[dict],
                injected: list[dict]) -> None:
    """One row per port, shaded while its egress was paused; the watchdog's storms marked
    (detected: a red tick, restored: a green one) and injected storms as a hatched bar."""
    end_t = readings[-1]["t"]
    storms = [s for s in storms if t0 <= s["detected_at"] <= end_t]
    for row, port in enumerate(ports):
        spans = paused_spans(readings, port, t0)
        ax.broken_barh([(to_x(a), to_x(b) - to_x(a)) for a, b in spans], (row - 0.35, 0.7), color="tab:orange",
                       label="paused" if row == 0 else None)
        for s in storms:
            if s["port"] != port:
                continue
            ax.plot([to_x(s["detected_at"] - t0)], [row], marker="v", color="red", ms=7,
                    label="storm detected" if not any(h.get_label() == "storm detected" for h in ax.lines) else None)
            if s.get("restored_at") is not None and s["restored_at"] <= end_t:
                ax.plot([to_x(s["restored_at"] - t0)], [row], marker="^", color="green", ms=7,
                        label="restored" if not any(h.get_label() == "restored" for h in ax.lines) else None)
    for inj in injected:
        end = min(inj.get("ended_at") or end_t, end_t)
        if end < t0:
            continue
        ax.axvspan(to_x(max(inj["started_at"], t0) - t0), to_x(end - t0), color="grey", alpha=0.15,
                   label=f"PAUSE injected by {inj['port']}")
    ax.set_yticks(range(len(ports)))
    ax.set_yticklabels(ports, fontsize=6)
    ax.set_ylim(-0.6, len(ports) - 0.4)
    ax.set_ylabel("egress paused")


def plot(recording: dict, path: str | Path, ports: list[str] | None = None) -> Path:
    """A PNG in the real fabric's units: each drawn port's dequeue rate and queue depth, and
    when its egress was paused, with the watchdog's storms; the title carries the time model."""
    import matplotlib

    matplotlib.use("Agg")  # no display: files only
    import matplotlib.pyplot as plt

    tm = TimeModel.from_dict(recording["time_model"])
    readings = recording["readings"]
    names = chosen(recording, ports)
    t0 = readings[0]["t"]
    index = {p["port"]: i for i, p in enumerate(readings[0]["ports"])}
    ms = lambda wall: tm.real_time(wall) * 1e3  # noqa: E731 - wall s -> real ms
    fig, (top, mid, bottom) = plt.subplots(3, 1, figsize=(10, 8 + 0.15 * len(names)), sharex=True)
    for name in names:
        i = index[name]
        xs, rates = [], []
        for a, b in zip(readings, readings[1:]):
            dt = b["t"] - a["t"]
            if dt > 0:
                xs.append(ms(b["t"] - t0))
                rates.append(tm.real_rate((b["ports"][i]["deq_bytes"] - a["ports"][i]["deq_bytes"]) * 8 / dt) / 1e9)
        top.plot(xs, rates, lw=0.8, label=name)
        mid.plot([ms(r["t"] - t0) for r in readings], [tm.real_size(r["ports"][i]["depth"]) / 1e3 for r in readings],
                 lw=0.8, label=name)
    top.set_ylabel("dequeued (Gb/s)")
    top.set_title(f"{recording.get('title') or recording.get('fabric', '')}\nscale {tm.scale:g}, dilation "
                  f"{tm.name}, granularity x{tm.distortion:g}; real units", fontsize=9)
    mid.set_ylabel("queue depth (KB)")
    draw_pauses(bottom, readings, names, t0, ms, recording.get("storms") or [], recording.get("injected") or [])
    return save(fig, (top, mid, bottom), path)


def save(fig, axes, path: str | Path) -> Path:
    """Finish a figure whose panels share the real fabric's time axis, write it, free it."""
    import matplotlib.pyplot as plt

    axes[-1].set_xlabel("time (ms of the real fabric)")
    for ax in axes:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=6, loc="upper right", ncol=2)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
