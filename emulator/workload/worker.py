"""One soft-NIC of a transfer, run in a host's namespace (``python -m emulator.workload.worker
serve|send``), with ``--qps`` queue pairs per peer. It is connected out of band by the
orchestrator (workload.transfer), as verbs applications exchange QPN and PSN (and the target's
R_Key and address) over a side channel: it prints a JSON ``ready`` line with its QPs and reads
its peer's.

The sender fills a buffer with seeded random bytes, splits it evenly over the QPs and posts each
share as RDMA WRITEs of ``chunk`` bytes, the last with immediate data so the target learns it is
complete. It reports completion time, goodput and the transport's counters per QP. The target
reports the SHA-256 of the region it received; the transfer is intact only when both digests
match.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import select
import sys
import time
from dataclasses import asdict

from emulator.nic import dcqcn
from emulator.nic.loop import SoftNic
from emulator.nic.rc import MODES, QpConfig, SUCCESS
from emulator.workload.records import (FlowEndpoint, QpEndpoint, QpFigures, SenderReady, SenderResult, SendersReady,
                                       TargetReady, TargetResult)

MTU_PAYLOAD = 4096
CHUNK = 1 << 20  # bytes per RDMA WRITE work request
PKT_WIRE = MTU_PAYLOAD + 12 + 16 + 4 + 42  # a full data packet on the host link
# Wall seconds within which a busy Python loop gets round to sending again: its serialiser and
# each QP's DCQCN pacer may run this far ahead of their rates (the host's shaper spreads it at
# line rate), or a loop that slept would never make up the rate it was owed.
NIC_SLACK_S = 2e-3
# A QP's DCQCN pacer, unlike the line's serialiser, keeps little in reserve: two frames, or this
# much wall time of its current rate (a loop that woke late may make up that much at once).
PACE_BURST = MTU_PAYLOAD + 100
PACE_SLACK_S = 0.2e-3
# Wall seconds below which a timeout is a busy host's scheduling, not loss; and the first
# timeout (before any RTT sample) and the longest one, also wall: each is / dilation on the
# NIC's virtual clock, so at d = 1000 the floor is 10 us of the real fabric's time.
RTO_FLOOR_WALL_S = 0.010
RTO_INITIAL_WALL_S = 0.05
RTO_MAX_WALL_S = 2.0
# And the real fabric's own, which dilation must not shrink: IRN's RTO_low and RTO_high (100 and
# 320 us; Mittal et al., SIGCOMM 2018): an incast's first queue holds hundreds of microseconds
# of data before any RTT is sampled, and a shorter first timeout resends what is only queued.
RTO_FLOOR_REAL_S = 100e-6
RTO_INITIAL_REAL_S = 320e-6
RTO_MAX_REAL_S = 10e-3
# And never under a few of the path's own RTTs: a longest timeout below the RTT (a cross-DC RTT is
# 30 ms, three times RTO_MAX_REAL_S) fires before any ACK can be back and resends what is in flight.
RTO_MAX_RTTS = 4
# Wall seconds between two looks at the orchestrator's stop while the target's data is still
# coming (the stop comes only after the senders have ended).
TOLD_EVERY_S = 0.01


def qp_config(mode: str, rate_bps: float, rtt_s: float, qps: int = 1, dilation: float = 1.0,
            window: str = "bdp") -> QpConfig:
    """In flight: one BDP (measured RTT x line rate, plus half again and 16 packets of slack for
    coalesced ACKs) for the NIC's QPs together, since they share the host's link; IRN caps each
    flow at a BDP, but QPs that each kept one would only queue in front of a slow receiver. The
    first timeout waits a few RTTs, until the RTT is sampled. ``rate_bps`` and ``rtt_s`` are
    wall figures (the BDP in bytes is the same on either clock); the timeouts are virtual."""
    bdp = math.ceil(rate_bps / 8 * max(rtt_s, 1e-4) / PKT_WIRE) if rate_bps else 1024
    d = dilation
    rx_window = max(8192, 4 * bdp)
    # window "none": in flight up to what the responder accepts, as a NIC without BDP-FC sends.
    inflight = rx_window if window == "none" else max(32, int(bdp * 1.5 / max(1, qps)) + 16)
    return QpConfig(mode=mode, max_inflight=inflight, rx_window=rx_window,
                    rto_initial=max(max(RTO_INITIAL_WALL_S, 4 * rtt_s) / d, RTO_INITIAL_REAL_S),
                    rto_min=max(RTO_FLOOR_WALL_S / d, RTO_FLOOR_REAL_S),
                    rto_max=max(RTO_MAX_WALL_S / d, RTO_MAX_REAL_S, RTO_MAX_RTTS * rtt_s / d))


def nic_burst(rate_bps: float, host_queue_bytes: int) -> int:
    """Bytes the NIC's serialiser and pacers may run ahead of their rates (``rate_bps`` the
    host link's emulated rate): NIC_SLACK_S of the line, within what the host's queue holds."""
    return int(max(2 * PKT_WIRE, min(host_queue_bytes - PKT_WIRE, rate_bps / 8 * NIC_SLACK_S)))


def _shares(size: int, qps: int) -> list[tuple[int, int]]:
    base = size // qps
    out, off = [], 0
    for i in range(qps):
        n = base + (1 if i < size % qps else 0)
        out.append((off, n))
        off += n
    return out


def pattern(size: int, seed: int) -> bytearray:
    """Seeded random bytes, made 64 MiB at a time (randbytes refuses 256 MiB and more at once)."""
    out = bytearray(size)
    step = 64 << 20
    for i, off in enumerate(range(0, size, step)):
        n = min(step, size - off)
        out[off:off + n] = random.Random(seed * 1_000_003 + i).randbytes(n)
    return out


def emit(kind: str, record) -> None:
    """One named record to the orchestrator, a JSON line."""
    sys.stdout.write(json.dumps({kind: asdict(record)}) + "\n")
    sys.stdout.flush()


def _read() -> dict:
    line = sys.stdin.readline()
    if not line:
        raise SystemExit("the controller went away")
    return json.loads(line)


def qp_figures(qp, dilation: float, completed_s: float | None) -> QpFigures:
    """A QP's counters; its RTT and RTO (virtual seconds) as wall seconds, like every time the
    workers report."""
    st = qp.stats
    return QpFigures(qp.qpn, st.data_packets, st.retransmits, st.timeouts, st.acks_received, st.naks_received,
                     st.delivered, st.held, st.naks_sent, st.acks_sent, st.cnps_received, st.cnps_sent,
                     qp.srtt * dilation if qp.srtt is not None else None, qp.rto * dilation,
                     qp.cfg.max_inflight, dict(st.dropped), qp.error, completed_s)


class Recorder:
    """Per-QP time series, sampled every ``period`` wall seconds on the orchestrator's clock
    (CLOCK_MONOTONIC is one clock for every namespace), in emulated units: rate and target rate,
    alpha, CNPs received and sent, CE-marked data received, bytes sent, packets resent."""

    # rate_bps: DCQCN's Rc averaged over the interval ending at the sample (cuts and recoveries
    # faster than the period still show); rc_bps: Rc at the sample.
    COLUMNS = ("rate_bps", "rc_bps", "target_bps", "alpha", "cnps_received", "cnps_sent", "ce_received", "tx_bytes",
               "unsent", "retransmits")

    def __init__(self, nic: SoftNic, qps: list, period: float, t0: float) -> None:
        self.nic, self.qps, self.period, self.t0 = nic, qps, period, t0
        self.t: list[float] = []
        self.series = {q.qpn: {c: [] for c in self.COLUMNS} for q in qps}
        self._next = 0.0
        self._last: dict[int, tuple[float, float]] = {}  # qpn -> (time, allowed bits)

    def tick(self) -> None:
        now = time.monotonic()
        if not self.period or now < self._next:
            return
        self._next = now + self.period
        self.t.append(round(now - self.t0, 6))
        for q in self.qps:
            st = self.nic.qp_state(q.qpn)
            t_prev, a_prev = self._last.get(q.qpn, (None, None))
            mean = (st.allowed_bits - a_prev) / (now - t_prev) if t_prev is not None and now > t_prev else st.rc_bps
            self._last[q.qpn] = (now, st.allowed_bits)
            row = {"rate_bps": mean, **st.as_dict()}
            for col in self.COLUMNS:
                self.series[q.qpn][col].append(row[col])

    def as_dict(self) -> dict:
        return {"t": self.t, "qps": {str(k): v for k, v in self.series.items()}}


def nic_for(a: argparse.Namespace) -> SoftNic:
    """The host's soft-NIC as the worker's options set it up (``add_nic_options``)."""
    cc = dcqcn.Profile(**json.loads(a.cc)) if a.cc else None
    # The loop runs on a virtual clock (wall / dilation): its line rate is per virtual second.
    return SoftNic(a.ip, a.rate * a.dilation, a.burst, cc=cc, dilation=a.dilation, pace_burst=PACE_BURST,
                   pace_burst_s=PACE_SLACK_S / a.dilation)


def _open(a: argparse.Namespace, peers: list[str]) -> tuple[SoftNic, list[list]]:
    """The NIC and ``a.qps`` QPs towards each peer."""
    nic = nic_for(a)
    cfg = qp_config(a.mode, a.rate, a.rtt, a.qps * len(peers), a.dilation, a.window)
    return nic, [[nic.create_qp(p, cfg, initial_psn=random.randrange(1 << 24)) for _ in range(a.qps)] for p in peers]


def _ready(qps: list) -> list[QpEndpoint]:
    return [QpEndpoint(q.qpn, q.ipsn, q.offers_sack) for q in qps]


def _connect(qps: list, peer: list[QpEndpoint]) -> None:
    for qp, p in zip(qps, peer):
        qp.connect(p.qpn, p.psn, sack=p.sack)


def _run(nic: SoftNic, rec: Recorder, done, timeout: float) -> bool:
    def check() -> bool:
        rec.tick()
        return done()

    return nic.run(check, timeout, max_wait=min(0.05, rec.period or 0.05))


def serve(a: argparse.Namespace) -> int:
    """The target of one flow per peer in ``--peer`` (comma-separated): a region of ``--size``
    bytes and ``--qps`` QPs for each."""
    peers = a.peer.split(",")
    nic, groups = _open(a, peers)
    regions = [nic.pd.register(bytearray(a.size)) for _ in peers]
    qps = [q for g in groups for q in g]
    for i, qp in enumerate(qps):
        qp.post_recv(i, bytearray(0))
    emit("ready", TargetReady([FlowEndpoint(_ready(g), mr.rkey, mr.va) for g, mr in zip(groups, regions)]))
    for g, flow in zip(groups, SendersReady.from_dict(_read()).senders):
        _connect(g, flow.qps)
    rec = Recorder(nic, qps, a.sample, a.t0 or time.monotonic())
    done: dict[int, float] = {}
    start, cpu0 = time.monotonic(), time.process_time()
    cpu = 0.0

    asked = 0.0  # when stdin was last looked at: a system call per turn of the NIC is not free

    def told() -> bool:
        nonlocal asked
        now = time.monotonic()
        if now < asked + TOLD_EVERY_S:
            return False
        asked = now
        return bool(select.select([sys.stdin], [], [], 0)[0])

    def finished() -> bool:
        nonlocal cpu
        for qp in qps:
            for wc in qp.recv_cq.poll():
                done[qp.qpn] = time.monotonic() - start
                cpu = time.process_time() - cpu0
        # Told to stop first: every sender has ended, and some QP of theirs failed (its retries
        # spent), so what it was writing will never complete here; report what did.
        return len(done) == len(qps) or told()

    _run(nic, rec, finished, a.timeout)
    ok = len(done) == len(qps)
    # Stay up until told: the sender may still need ACKs for its last packets.
    while not select.select([sys.stdin], [], [], 0)[0]:
        nic.step(0.01)
        rec.tick()
    emit("result", TargetResult(ok, [hashlib.sha256(mr.buffer).hexdigest() for mr in regions], nic.stats(),
                                 rec.as_dict(), [qp_figures(q, a.dilation, done.get(q.qpn)) for q in qps], cpu))
    return 0


def send(a: argparse.Namespace) -> int:
    nic, (qps,) = _open(a, [a.peer])
    data = pattern(a.size, a.seed)
    digest = hashlib.sha256(data).hexdigest()
    emit("ready", SenderReady(_ready(qps)))
    peer = FlowEndpoint.from_dict(_read())  # the target's flow for us: its QPs, R_Key and address
    _connect(qps, peer.qps)
    view = memoryview(data)
    expected = 0
    for i, (qp, (off, n)) in enumerate(zip(qps, _shares(a.size, a.qps))):
        chunks = range(off, off + n, a.chunk) if n else [off]
        for k, c in enumerate(chunks):
            last = k == len(chunks) - 1
            qp.post_write(c, view[c:min(c + a.chunk, off + n)], peer.va + c, peer.rkey, imm=i if last else None)
            expected += 1
    completed: dict[int, float] = {}
    failed: list[dict] = []
    got = 0
    rec = Recorder(nic, qps, a.sample, a.t0 or time.monotonic())
    start, cpu0 = time.monotonic(), time.process_time()

    def finished() -> bool:
        nonlocal got
        for qp in qps:
            for wc in qp.send_cq.poll():
                got += 1
                if wc.status != SUCCESS:
                    failed.append({"qpn": qp.qpn, "wr_id": wc.wr_id, "status": wc.status})
            if qp.idle and qp.qpn not in completed:
                completed[qp.qpn] = time.monotonic() - start
        return got == expected

    ok = _run(nic, rec, finished, a.timeout)
    seconds, cpu = time.monotonic() - start, time.process_time() - cpu0
    rec.tick()
    emit("result", SenderResult(ok and not failed, digest, seconds, a.size, start - (a.t0 or start),
                                 a.size * 8 / seconds if ok and not failed else 0.0, failed[:20], nic.stats(),
                                 rec.as_dict(), [qp_figures(q, a.dilation, completed.get(q.qpn)) for q in qps],
                                 cpu))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m emulator.workload.worker")
    ap.add_argument("role", choices=("serve", "send"))
    ap.add_argument("--peer", required=True)
    ap.add_argument("--chunk", type=int, default=CHUNK)
    ap.add_argument("--seed", type=int, default=1)
    add_nic_options(ap)
    a = ap.parse_args(argv)
    return serve(a) if a.role == "serve" else send(a)


def add_nic_options(ap: argparse.ArgumentParser) -> None:
    """The options every soft-NIC worker takes (this one and workload.collective_worker)."""
    ap.add_argument("--ip", required=True)
    ap.add_argument("--qps", type=int, default=1)
    ap.add_argument("--size", type=int, required=True)
    ap.add_argument("--mode", choices=MODES, default="selective")
    ap.add_argument("--rate", type=float, default=0.0, help="line rate, bit/s (0: unpaced)")
    ap.add_argument("--burst", type=int, default=64 << 10)
    ap.add_argument("--rtt", type=float, default=0.001, help="measured RTT, s: sizes the window")
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--cc", default="", help="DCQCN profile as JSON (already scaled to the NIC's units); empty: none")
    ap.add_argument("--dilation", type=float, default=1.0, help="wall time per real time: the NIC's clock is wall / this")
    ap.add_argument("--window", choices=("bdp", "none"), default="bdp", help="in flight: one BDP, or no cap")
    ap.add_argument("--sample", type=float, default=0.0, help="telemetry period, s (0: none)")
    ap.add_argument("--t0", type=float, default=0.0, help="the orchestrator's CLOCK_MONOTONIC origin")


if __name__ == "__main__":
    sys.exit(main())
