"""Is this run faithful? Checks in the style of Mininet-HiFi, each pure, each with what would fit.

An emulator that prints figures must also say when they are the emulator's rather than the
topology's. Three things can make them so, beside the machine itself (softirq, steal and drops
outside the model are the fidelity guard's, emulator/telemetry/ports.py):

- **granularity**: the time model's distortion 1/(s*d) makes a frame coarser than the byte
  thresholds and time constants a mechanism works with (at realtime the DCQCN paper's 5 KB Kmin
  is 5 bytes, less than a frame, and its 50 us N is shorter than one frame time): the mechanism
  cannot behave as it does in the real fabric, however fast the machine.
- **the NICs' loop lag**: a Python soft-NIC answers a marked packet and reacts to a CNP late by
  its own loop's lag; on the dilated clock that lag shrinks by d. The NICs measure how late each
  CNP left and each cut came against the time the protocol set for it (the mark's arrival, the
  notification point's interval, the configured delays): only that part of the feedback delay
  is the emulator's own, and the check holds it against the feedback loop the topology models
  (its in-DC RTT plus the NICs' configured delays).
- **NIC pacing**: a sending NIC out of CPU sends less than its rate allows (at the start of an
  incast, every sender at line rate at once), and the loop is then not the topology's.
- **dequeue pacing**: on a busy bottleneck consecutive frames must leave their queue a frame
  time apart (Mininet-HiFi's invariant); a shaper or a NAPI poll that runs late stretches the
  gaps, and the link delivers less than its rate.

Each check returns a Finding; ``verdict`` joins them (and the guard's limits) into one.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from emulator.model import units
from emulator.model.timemodel import TimeModel

# The emulator's own share of the DCQCN feedback loop may be at most this fraction of the loop
# the topology models, at the median and (FEEDBACK_P90_SHARE) at the 90th percentile.
FEEDBACK_P50_SHARE = 0.5
FEEDBACK_P90_SHARE = 2.0
# A backlogged port must deliver at least this share of its rate while busy.
BUSY_RATE_SHARE = 0.95
# At most this share of a busy port's gaps may exceed twice the frame time.
LATE_GAP_SHARE = 0.05
# A sending NIC may leave at most this share of what its rate allowed unsent, and no telemetry
# interval below NIC_MIN_SHARE of it (a NIC out of CPU is slower than the fabric it drives).
NIC_OWED_SHARE = 0.05
NIC_MIN_SHARE = 0.5
NIC_MIN_FRAMES = 4  # an interval that allowed fewer frames than this says nothing
FRAME = 4096 + 100  # a full RoCE frame on the host link, about
# Below this many busy gaps a port's pacing says nothing.
MIN_BUSY_GAPS = 100
# A port backlogged for less than this share of the run was not a bottleneck.
BUSY_SHARE = 0.05


@dataclass(frozen=True)
class Finding:
    check: str  # granularity | feedback | nic pacing | dequeue pacing
    ok: bool
    message: str
    where: str = ""  # the port a dequeue-pacing finding is about

    def as_dict(self) -> dict:
        return asdict(self)


def granularity(tm: TimeModel, frame_bytes: int, host_rate_bps: float, ecn: tuple[int, int] | None,
                dcqcn: dict | None) -> list[Finding]:
    """Whether a frame is finer than what DCQCN and ECN work with, in the real fabric's terms.
    ``ecn``: the switches' (Kmin, Kmax) as they run (emulated bytes); ``dcqcn``: the profile's
    real-unit fields (None: no DCQCN); ``host_rate_bps``: the host link's real rate."""
    out = []
    if ecn is not None:
        kmin, kmax = ecn
        if kmax < frame_bytes or kmin < frame_bytes / 2:
            out.append(Finding("granularity", False,
                               f"the switches' ECN thresholds run at {units.format_size(kmin)} / "
                               f"{units.format_size(kmax)} (x s*d = {tm.byte_scale:g}), against "
                               f"{frame_bytes}-byte frames: marking cannot track the queue as in the real "
                               f"fabric; run faithful (d = {1 / tm.scale:g}: up --dilation faithful)"))
    if dcqcn is not None:
        # A frame time in the real fabric's time: what one frame takes on the host link, / d.
        frame_s = tm.real_time(frame_bytes * 8 / tm.rate(host_rate_bps))
        short = {k: dcqcn[f] for k, f in (("N", "cnp_interval_s"), ("K", "alpha_period_s"), ("T", "timer_s"))
                 if dcqcn.get(f) and dcqcn[f] < frame_s and not (k == "K" and dcqcn[f] <= 2e-6)}
        if short:
            which = ", ".join(f"{k} {units.format_duration(v)}" for k, v in short.items())
            out.append(Finding("granularity", False,
                               f"DCQCN's {which} {'are' if len(short) > 1 else 'is'} shorter than one frame time "
                               f"({units.format_duration(frame_s)} of the real fabric's at distortion "
                               f"{tm.distortion:g}): its timers see a handful of packets where the real NIC sees "
                               f"thousands; run faithful (up --dilation faithful)"))
    if not out:
        out.append(Finding("granularity", True, f"frames are {tm.distortion:g}x the real fabric's granularity"
                                                 + (" (faithful)" if abs(tm.distortion - 1) < 1e-6 else "")))
    return out


def feedback(tm: TimeModel, cnp_late: dict | None, reaction_late: dict | None, loop_s: float) -> Finding:
    """The NICs' own lateness against the feedback loop the topology models.

    ``cnp_late``: the receiving NIC's lateness summary (p50, p90; wall seconds): how long after
    the time the protocol set for it (the mark's arrival, the NP's interval and the configured
    CNP delay) each CNP left; ``reaction_late``: the worst sender's, from a CNP's arrival plus
    the configured reaction delay to the cut; ``loop_s``: the modelled feedback loop, real
    seconds (in-DC RTT + configured NIC delays)."""
    if not cnp_late and not reaction_late:
        return Finding("feedback", True, "no CNPs: no feedback loop to judge")

    def added(q: str) -> float:
        return sum(tm.real_time(x[q]) for x in (cnp_late, reaction_late) if x)

    p50, p90 = added("p50"), added("p90")
    limit50, limit90 = FEEDBACK_P50_SHARE * loop_s, FEEDBACK_P90_SHARE * loop_s
    what = (f"the NICs added {units.format_duration(p50)} (p50; p90 {units.format_duration(p90)}) of their own "
            f"to a feedback loop of {units.format_duration(loop_s)}")
    if p50 <= limit50 and p90 <= limit90:
        return Finding("feedback", True, what)
    # The lag in wall time is the machine's; a larger dilation shrinks it in the fabric's time.
    need = tm.dilation * max(p50 / limit50, p90 / limit90)
    fit = (f"a dilation of {need:.3g} would fit" if need * tm.scale <= 1 else
           f"no dilation fits at scale {tm.scale:g} (it would need {need:.3g} > 1/scale): lower the scale and "
           "run faithful")
    return Finding("feedback", False, f"NOT FAITHFUL: {what} (limits {units.format_duration(limit50)} at p50, "
                                      f"{units.format_duration(limit90)} at p90); {fit}")


def nic_pacing(tm: TimeModel, senders: dict[str, dict], begin: float = 0.0, end: float = math.inf) -> Finding | None:
    """Whether the sending NICs kept up with their rates: per telemetry interval (the first and
    the last of each sender aside: it started or ended inside them) that ended with new data
    still to send, the bytes a QP sent against the integral of its rate (``senders``: each
    host's telemetry, emulated units). A NIC out of
    CPU sends less than it may, and the loop it is part of is not the topology's: more than
    NIC_OWED_SHARE of the owed bytes unsent, or any interval at less than NIC_MIN_SHARE of its
    rate, is a finding. Only for NICs without a window (a window or ACK clock holds a sender
    back by design), and only while every sender sent (``begin``..``end``, wall seconds on the
    telemetry's clock: once one has finished, its process writing out its report competes for
    the CPUs); None when nothing can be said."""
    owed = sent = 0.0
    worst, where = 1.0, ""
    for host, tel in senders.items():
        t = tel["t"]
        for q in tel["qps"].values():
            tx, unsent = q["tx_bytes"], q["unsent"]
            for k in range(2, len(t) - 1):
                if not begin <= t[k - 1] < t[k] <= end:
                    continue
                allowed = q["rate_bps"][k] * (t[k] - t[k - 1]) / 8
                if allowed < NIC_MIN_FRAMES * FRAME or not unsent[k]:
                    continue  # too little to tell from whole frames, or nothing new left to send
                got = tx[k] - tx[k - 1] + FRAME  # a frame's worth of rounding either way
                owed += allowed
                sent += min(got, allowed)
                if got / allowed < worst:
                    worst, where = got / allowed, f"{host} at {units.format_duration(tm.real_time(t[k]))}"
    if owed <= 0:
        return None
    share = sent / owed
    what = (f"the senders sent {share:.3f} of what their rates allowed; the worst interval {worst:.2f} "
            f"({where})")
    if share >= 1 - NIC_OWED_SHARE and worst >= NIC_MIN_SHARE:
        return Finding("nic pacing", True, what)
    return Finding("nic pacing", False, f"NOT FAITHFUL: {what}: a NIC was out of CPU and sent less than its "
                                        f"rate; lower the scale (and dilate in step: faithful)")


def dequeue_pacing(port: str, tm: TimeModel, delta: dict, rate_bps: float, interval_s: float) -> Finding | None:
    """One port's busy dequeue gaps between two readings ``interval_s`` wall seconds apart
    (``delta``: the datapath's pacing counters' differences: edges, counts, busy_ns,
    busy_bytes, busy_gaps) against its rate (emulated bit/s). None when the port was not a busy
    bottleneck: backlogged for less than BUSY_SHARE of the interval, or for too few gaps to say
    (a fast port's few backlogged frames leave at once, within its shaper's burst)."""
    if delta["busy_gaps"] < MIN_BUSY_GAPS or delta["busy_ns"] < BUSY_SHARE * interval_s * 1e9:
        return None
    achieved = delta["busy_bytes"] * 8 / (delta["busy_ns"] * 1e-9)
    share = achieved / rate_bps
    late = sum(c for edge, c in zip([0.0, *delta["edges"]], delta["counts"]) if edge >= 2.0) / delta["busy_gaps"]
    what = (f"{port}: while backlogged it delivered {share:.3f} of its rate "
            f"({units.format_rate(tm.real_rate(achieved))} of {units.format_rate(tm.real_rate(rate_bps))}); "
            f"{late:.1%} of {delta['busy_gaps']} gaps exceeded two frame times")
    if share >= BUSY_RATE_SHARE and late <= LATE_GAP_SHARE:
        return Finding("dequeue pacing", True, what, port)
    return Finding("dequeue pacing", False,
                   f"NOT FAITHFUL: {what}: the shaper or the peer's poll ran late (out of CPU); lower the load, or "
                   f"the scale (s = {tm.scale * share * 0.8:.2g} would fit) and dilate in step", port)


def verdict(findings: list[Finding], machine_limits: list[str] | None = None) -> dict:
    """One verdict: faithful only if every check and the machine guard agree."""
    limits = list(machine_limits or [])
    bad = [f for f in findings if not f.ok]
    return {"faithful": not bad and not limits, "findings": [f.as_dict() for f in findings],
            "machine_limits": limits}
