"""``backplane run transfer``: RDMA WRITEs from one host's soft-NIC into another's, measured.

Two worker processes, one per host namespace (``python -m emulator.nic.transfer serve|send``),
each one soft-NIC with ``--qps`` queue pairs. They are connected out of band through this
module, as verbs applications exchange QPN and PSN (and the target's R_Key and address) over a
side channel: each worker prints a JSON ``ready`` line with its QPs and reads its peer's.

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
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field

from . import dcqcn
from .loop import SoftNic
from .rc import MODES, SUCCESS, QpConfig

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


def _config(mode: str, rate_bps: float, rtt_s: float, qps: int = 1, dilation: float = 1.0,
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
                    rto_max=max(RTO_MAX_WALL_S / d, RTO_MAX_REAL_S))


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


def _emit(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _read() -> dict:
    line = sys.stdin.readline()
    if not line:
        raise SystemExit("the controller went away")
    return json.loads(line)


def _qp_figures(qp, dilation: float) -> dict:
    """A QP's counters; its RTT and RTO (virtual seconds) as wall seconds, like every time the
    workers report."""
    st = qp.stats
    return {"qpn": qp.qpn, "data_packets": st.data_packets, "retransmits": st.retransmits, "timeouts": st.timeouts,
            "acks_received": st.acks_received, "naks_received": st.naks_received, "delivered": st.delivered,
            "held": st.held, "naks_sent": st.naks_sent, "acks_sent": st.acks_sent,
            "cnps_received": st.cnps_received, "cnps_sent": st.cnps_sent,
            "srtt_s": qp.srtt * dilation if qp.srtt is not None else None, "rto_s": qp.rto * dilation,
            "max_inflight": qp.cfg.max_inflight, "dropped": dict(st.dropped), "error": qp.error}


class Recorder:
    """Per-QP time series, sampled every ``period`` wall seconds on the orchestrator's clock
    (CLOCK_MONOTONIC is one clock for every namespace), in emulated units: rate and target rate,
    alpha, CNPs received and sent, CE-marked data received, bytes sent."""

    # rate_bps: DCQCN's Rc averaged over the interval ending at the sample (cuts and recoveries
    # faster than the period still show); rc_bps: Rc at the sample.
    COLUMNS = ("rate_bps", "rc_bps", "target_bps", "alpha", "cnps_received", "cnps_sent", "ce_received", "tx_bytes",
               "unsent")

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


def _open(a: argparse.Namespace, peers: list[str]) -> tuple[SoftNic, list[list]]:
    """The NIC and ``a.qps`` QPs towards each peer."""
    cc = dcqcn.Profile(**json.loads(a.cc)) if a.cc else None
    # The loop runs on a virtual clock (wall / dilation): its line rate is per virtual second.
    nic = SoftNic(a.ip, a.rate * a.dilation, a.burst, cc=cc, dilation=a.dilation, pace_burst=PACE_BURST,
                  pace_burst_s=PACE_SLACK_S / a.dilation)
    cfg = _config(a.mode, a.rate, a.rtt, a.qps * len(peers), a.dilation, a.window)
    return nic, [[nic.create_qp(p, cfg, initial_psn=random.randrange(1 << 24)) for _ in range(a.qps)] for p in peers]


def _ready(qps: list) -> list[dict]:
    return [{"qpn": q.qpn, "psn": q.ipsn} for q in qps]


def _connect(qps: list, peer: list[dict]) -> None:
    for qp, p in zip(qps, peer):
        qp.connect(p["qpn"], p["psn"])


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
    _emit({"ready": {"flows": [{"qps": _ready(g), "rkey": mr.rkey, "va": mr.va} for g, mr in zip(groups, regions)]}})
    for g, flow in zip(groups, _read()["flows"]):
        _connect(g, flow["qps"])
    rec = Recorder(nic, qps, a.sample, a.t0 or time.monotonic())
    done: dict[int, float] = {}
    start = time.monotonic()

    def finished() -> bool:
        for qp in qps:
            for wc in qp.recv_cq.poll():
                done[qp.qpn] = time.monotonic() - start
        return len(done) == len(qps)

    ok = _run(nic, rec, finished, a.timeout)
    # Stay up until told: the sender may still need ACKs for its last packets.
    while not select.select([sys.stdin], [], [], 0)[0]:
        nic.step(0.01)
        rec.tick()
    _emit({"result": {"complete": ok, "sha256": [hashlib.sha256(mr.buffer).hexdigest() for mr in regions],
                      "nic": nic.stats(), "telemetry": rec.as_dict(),
                      "qps": [_qp_figures(q, a.dilation) | {"completed_s": done.get(q.qpn)} for q in qps]}})
    return 0


def send(a: argparse.Namespace) -> int:
    nic, (qps,) = _open(a, [a.peer])
    data = pattern(a.size, a.seed)
    digest = hashlib.sha256(data).hexdigest()
    _emit({"ready": {"qps": _ready(qps)}})
    peer = _read()  # the target's flow for us: its QPs, R_Key and address
    _connect(qps, peer["qps"])
    view = memoryview(data)
    expected = 0
    for i, (qp, (off, n)) in enumerate(zip(qps, _shares(a.size, a.qps))):
        chunks = range(off, off + n, a.chunk) if n else [off]
        for k, c in enumerate(chunks):
            last = k == len(chunks) - 1
            qp.post_write(c, view[c:min(c + a.chunk, off + n)], peer["va"] + c, peer["rkey"], imm=i if last else None)
            expected += 1
    completed: dict[int, float] = {}
    failed: list[dict] = []
    got = 0
    rec = Recorder(nic, qps, a.sample, a.t0 or time.monotonic())
    start = time.monotonic()

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
    seconds = time.monotonic() - start
    rec.tick()
    _emit({"result": {"complete": ok and not failed, "sha256": digest, "seconds": seconds, "bytes": a.size,
                      "started_s": start - (a.t0 or start), "goodput_bps": a.size * 8 / seconds if ok and not failed else 0.0,
                      "failed": failed[:20], "nic": nic.stats(), "telemetry": rec.as_dict(),
                      "qps": [_qp_figures(q, a.dilation) | {"completed_s": completed.get(q.qpn)} for q in qps]}})
    return 0


# --- the orchestrator, run by the CLI in the root namespace ---

@dataclass
class TransferResult:
    src: str  # the sender; several, comma-separated, for an incast into ``dst``
    dst: str
    transport: str
    size: int  # bytes per sender
    qps: int  # QPs per sender
    intact: bool
    complete: bool
    seconds: float  # from the first sender's start to the last one's completion
    goodput_bps: float  # all senders' bytes over ``seconds``
    line_rate_bps: int
    rtt_s: float
    rate_control: str  # "DCQCN <profile>" or "none (line-rate pacing only)"
    retransmits: int
    timeouts: int
    data_packets: int
    cnps: int  # CNPs the senders received
    sender: dict = field(repr=False)  # the first sender's report
    receiver: dict = field(repr=False)
    senders: list[dict] = field(default_factory=list, repr=False)
    flows: list[dict] = field(default_factory=list)  # per sender: goodput, time, counters
    dcqcn: dict | None = None  # the profile the NICs ran, in their units (rates and bytes x scale*dilation)
    telemetry: dict = field(default_factory=dict, repr=False)  # series; emulator/report.py reads them
    time_model: dict = field(default_factory=dict)  # scale, dilation: every figure here is emulated
    # What the topology models, in real units, for judging the run (report.fidelity) and for
    # modelling it: the in-DC RTT, the host link's rate, the frame, the DCQCN profile.
    scenario: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)


def _path_rtt(plan, src: str, dst: str, tries: int = 4) -> float:
    """The RTT that sizes the window: the least of a few pings, once they agree. Pings that
    waited behind a neighbour lookup (an ARP lost on a lossy path costs a second) arrive
    spaced by their interval and are not the path's RTT: measure again."""
    from .. import measure

    best = float("inf")
    for i in range(tries):
        r = measure.rtt(plan, src, dst, count=3, interval=0.05)
        best = min(best, r.min_s)
        # A first round can wait behind the lookup as a whole (all three pings late alike):
        # trust only a round that agrees with itself after one that has resolved the neighbours.
        if i > 0 and r.max_s <= 2 * r.min_s + 0.002:
            break
    return best


def _has_netem() -> bool:
    from .. import capabilities

    return capabilities.has_netem()


def _host_port(plan, host: str):
    ports = list(plan.ports(host))
    if plan.node(host).role != "host" or not ports:
        raise ValueError(f"{host} is not a host")
    return ports[0]


def _ports_meta(plan) -> dict:
    from ..plan import SWITCH_ROLES

    return {f"{p.node}:{p.ifname}": {"rate_bps": getattr(p.egress, "rate_bps", None),
                                     "buffer_bytes": getattr(p.egress, "buffer_bytes", None)}
            for p in plan.ports() if plan.node(p.node).role in SWITCH_ROLES}


class PortSampler(threading.Thread):
    """Calls ``sample()`` (the controller's port readings) every ``period`` seconds, or less
    often when a reading is slow, until stopped."""

    def __init__(self, sample, period: float) -> None:
        super().__init__(daemon=True)
        self.sample, self.period = sample, period
        self.readings: list[dict] = []
        self.error: str | None = None
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            began = time.monotonic()
            try:
                self.readings.append(self.sample())
            except Exception as e:  # noqa: BLE001 - reported with the result, never a crash
                self.error = f"{type(e).__name__}: {e}"
                return
            # Reading the maps costs the controller CPU the fabric needs (20x more in a VM
            # without KVM): never spend more than a fifth of the time on it.
            self._stop_event.wait(max(self.period, 4 * (time.monotonic() - began)))

    def stop(self) -> list[dict]:
        self._stop_event.set()
        self.join(5)
        return self.readings


def run(plan, src: str | list[str], dst: str, size: int, qps: int, transport: str, timeout: float = 300.0,
        chunk: int = CHUNK, seed: int = 1, rate_bps: float | None = None, cc: dcqcn.Profile | None = None,
        sample_s: float = 0.0, sampler=None, on_start=None) -> TransferResult:
    """Move ``size`` bytes from each host in ``src`` to host ``dst`` over ``qps`` QPs each, all
    senders at once, and check every byte. The NICs send at the host link's rate, or at
    ``rate_bps`` (emulated) if that is given; ``cc`` is the DCQCN profile they run, in real
    units (None or ``off``: none), scaled here to the NICs' by the fabric's time model. With
    ``sample_s`` (wall seconds), the NICs record their QPs' state that often and ``sampler()``
    (the controller's port readings) is called that often too; ``on_start()`` is called once
    every NIC is up and connected, just before the data starts (the fabric's fidelity monitor
    judges from there). Every figure in the result is emulated (wall seconds, emulated bytes
    and rates); ``time_model`` turns them into real ones."""
    from .. import describe, netns
    from ..errors import MeasurementError

    srcs = [src] if isinstance(src, str) else list(src)
    if transport not in MODES:
        raise MeasurementError(f"transport {transport!r}: use one of {', '.join(MODES)}")
    if len(set(srcs)) != len(srcs) or dst in srcs:
        raise MeasurementError(f"senders must be distinct hosts other than the target: {', '.join(srcs)} -> {dst}")
    ports = [_host_port(plan, h) for h in srcs]
    last_hop = plan.peer(_host_port(plan, dst))
    rate = rate_bps or ports[0].egress.rate_bps
    dst_ip = str(plan.host_address(dst))
    src_ips = [str(p.address.ip) for p in ports]
    rtt = max(_path_rtt(plan, h, dst) for h in srcs)
    # The window is one BDP of the real fabric's RTT: where the in-DC latency is not applied
    # (no netem here), the emulator's own RTT is shorter than the topology's and would starve it.
    window_rtt = max(rtt, 2 * plan.spec.emulated_time(plan.spec.intra_dc_one_way_s()))
    burst = nic_burst(rate, ports[0].egress.qdisc_limit)
    tm = plan.spec.time
    running = cc.scaled(tm.byte_scale) if cc is not None and cc.enabled else None
    t0 = time.monotonic()
    common = ["--qps", str(qps), "--size", str(size), "--mode", transport, "--rate", str(rate),
              "--burst", str(burst), "--rtt", str(window_rtt), "--timeout", str(timeout), "--sample", str(sample_s),
              "--t0", repr(t0), "--cc", json.dumps(asdict(running)) if running else "",
              "--dilation", repr(tm.dilation), "--window", plan.spec.nic.window]
    py = [sys.executable, "-m", "emulator.nic.transfer"]
    procs = []

    def start(host: str, argv: list[str]) -> tuple[subprocess.Popen, dict]:
        p = netns.popen(plan.netns(host), py + argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE, text=True)
        procs.append(p)
        line = p.stdout.readline()
        if not line:
            raise MeasurementError(f"soft-NIC on {host} did not start: {p.stderr.read().strip()}")
        return p, json.loads(line)["ready"]

    def result(p: subprocess.Popen, host: str, wait: float) -> dict:
        if not select.select([p.stdout], [], [], wait)[0]:
            raise MeasurementError(f"soft-NIC on {host} gave no result within {wait:g} s")
        line = p.stdout.readline()
        if not line:
            raise MeasurementError(f"soft-NIC on {host} ended without a result: {p.stderr.read().strip()[-2000:]}")
        return json.loads(line)["result"]

    sampling = PortSampler(sampler, sample_s) if sampler is not None and sample_s > 0 else None
    try:
        server, s_ready = start(dst, ["serve", "--ip", dst_ip, "--peer", ",".join(src_ips), *common])
        clients = [start(h, ["send", "--ip", ip, "--peer", dst_ip, "--chunk", str(chunk), "--seed", str(seed + i),
                             *common]) for i, (h, ip) in enumerate(zip(srcs, src_ips))]
        if sampling is not None:
            sampling.start()
        if on_start is not None:
            on_start()
        server.stdin.write(json.dumps({"flows": [r for _, r in clients]}) + "\n")
        server.stdin.flush()
        for (p, _), flow in zip(clients, s_ready["flows"]):
            p.stdin.write(json.dumps(flow) + "\n")
            p.stdin.flush()
        sent = [result(p, h, timeout + 30) for (p, _), h in zip(clients, srcs)]
        server.stdin.write("stop\n")
        server.stdin.flush()
        got = result(server, dst, 30)
    finally:
        readings = sampling.stop() if sampling is not None else []
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    flows = []
    for h, r, digest in zip(srcs, sent, got["sha256"]):
        flows.append({"src": h, "intact": r["sha256"] == digest and got["complete"], "complete": r["complete"],
                      "started_s": r["started_s"], "seconds": r["seconds"], "goodput_bps": r["goodput_bps"],
                      **{k: sum(q[k] for q in r["qps"]) for k in ("data_packets", "retransmits", "timeouts", "cnps_received")}})
    begin = min(f["started_s"] for f in flows)
    span = max(f["started_s"] + f["seconds"] for f in flows) - begin
    complete = all(f["complete"] for f in flows)
    telemetry = {"t0_monotonic": t0, "sample_s": sample_s, "senders": {h: r["telemetry"] for h, r in zip(srcs, sent)},
                 "receiver": got["telemetry"], "ports": readings,
                 "ports_error": sampling.error if sampling is not None else None,
                 "ports_meta": _ports_meta(plan), "ecn": describe.ecn_thresholds(plan.spec)}
    return TransferResult(
        ",".join(srcs), dst, transport, size, qps, intact=all(f["intact"] for f in flows), complete=complete,
        seconds=span, goodput_bps=len(srcs) * size * 8 / span if complete and span > 0 else 0.0, line_rate_bps=rate,
        rtt_s=rtt, rate_control=f"DCQCN {running.name}" if running else "none (line-rate pacing only)",
        retransmits=sum(f["retransmits"] for f in flows), timeouts=sum(f["timeouts"] for f in flows),
        data_packets=sum(f["data_packets"] for f in flows), cnps=sum(f["cnps_received"] for f in flows),
        sender=sent[0], receiver=got, senders=sent, flows=flows, dcqcn=asdict(running) if running else None,
        telemetry=telemetry, time_model=tm.as_dict(),
        scenario={"intra_dc_rtt_s": 2 * plan.spec.intra_dc_one_way_s(), "host_rate_bps": plan.spec.links.host,
                  "frame_bytes": plan.spec.mtu + 14, "dcqcn": asdict(cc) if running else None,
                  "intra_dc_delay_applied": plan.intra_delay_applies(_has_netem()),
                  # The switch port into the target: the queue an incast shares.
                  "bottleneck": f"{last_hop.node}:{last_hop.ifname}", "nic_burst_bytes": burst,
                  "window": plan.spec.nic.window,
                  "ack_every": QpConfig().ackreq_every})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m emulator.nic.transfer")
    ap.add_argument("role", choices=("serve", "send"))
    ap.add_argument("--ip", required=True)
    ap.add_argument("--peer", required=True)
    ap.add_argument("--qps", type=int, default=1)
    ap.add_argument("--size", type=int, required=True)
    ap.add_argument("--mode", choices=MODES, default="selective")
    ap.add_argument("--rate", type=float, default=0.0, help="line rate, bit/s (0: unpaced)")
    ap.add_argument("--burst", type=int, default=64 << 10)
    ap.add_argument("--rtt", type=float, default=0.001, help="measured RTT, s: sizes the window")
    ap.add_argument("--chunk", type=int, default=CHUNK)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--cc", default="", help="DCQCN profile as JSON (already scaled to the NIC's units); empty: none")
    ap.add_argument("--dilation", type=float, default=1.0, help="wall time per real time: the NIC's clock is wall / this")
    ap.add_argument("--window", choices=("bdp", "none"), default="bdp", help="in flight: one BDP, or no cap")
    ap.add_argument("--sample", type=float, default=0.0, help="telemetry period, s (0: none)")
    ap.add_argument("--t0", type=float, default=0.0, help="the orchestrator's CLOCK_MONOTONIC origin")
    a = ap.parse_args(argv)
    return serve(a) if a.role == "serve" else send(a)


if __name__ == "__main__":
    sys.exit(main())
