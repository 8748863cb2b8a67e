"""``backplane run collective``: a collective (workload.collectives) across hosts' soft-NICs,
measured as nccl-tests measures one. Run by the CLI in the root namespace: it starts one rank
(workload.collective_worker) per host namespace, hands every rank the others' QPs, then runs the
collective ``iters`` times behind a barrier (every rank told to go, every rank done) and checks
every rank's result against what the operation means, computed here from the same seeds.

The ring follows the order the hosts are given in: hosts of one DC listed together make a ring
that crosses the long-haul paths twice, as a placement-aware NCCL ring does.
"""
from __future__ import annotations

import hashlib
import json
import select
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

from emulator.errors import UsageError
from emulator.fabric import capabilities, netns
from emulator.model import units
from emulator.nic import dcqcn
from emulator.nic.rc import MODES
from emulator.workload import collectives as C
from emulator.workload.collective_worker import RankResult, RunFigures
from emulator.workload.limits import CHUNK_BYTES, MAX_ADMISSION, MAX_CHANNELS, MAX_QPS
from emulator.workload.rank import RankReady
from emulator.workload.transfer import MEMORY_SHARE, PortSampler, Worker, WorkerFailed, _host_port, _path_rtt, check_hosts
from emulator.workload.worker import nic_burst

MIN_CHUNK = 4096  # one frame's payload: a smaller chunk only costs more work requests
# Bytes each rank's host holds per byte of the collective's size (input, working buffer,
# staging for each message and the copies in flight), and the orchestrator per rank (inputs and
# expected results).
HOST_BYTES_PER_BYTE = 5
ORCHESTRATOR_BYTES_PER_BYTE = 3


@dataclass
class CollectiveResult:
    op: str
    hosts: list[str]  # in ring order
    size: int  # bytes, nccl-tests' size, as the NICs move it (emulated)
    channels: int
    qps: int  # per link
    transport: str
    iters: int
    intact: bool  # every rank's result, every run, equal to the operation's
    complete: bool
    times_s: list[float]  # wall seconds per run: first rank's go to last rank's end
    time_s: float  # their mean, as nccl-tests reports
    algbw_bps: float  # emulated
    busbw_bps: float
    busbw_factor: float
    line_rate_bps: int
    cross_dc: bool
    hop_rtts_s: dict[str, float]  # each ring hop's measured RTT (wall)
    alpha_s: float  # the step latency: half the longest hop's RTT (wall)
    model_s: float  # the alpha-beta model's time at the line rate and that alpha (wall)
    path_model_s: float  # the same with each chunk paying only the hops it crosses (collectives.ring_path)
    rate_control: str
    admission: int  # clear-to-send window per link and channel (0: none)
    retransmits: int
    timeouts: int
    data_packets: int
    chunk: int = CHUNK_BYTES  # bytes a message is cut into, dealt round its QPs (emulated)
    ranks: list[dict] = field(default_factory=list, repr=False)  # per rank: runs and counters
    time_model: dict = field(default_factory=dict)
    # With a sampler: the controller's port readings from the first run's start to the last's
    # end (monotonic ``t``), from ``t0_monotonic``; ``ports_error`` if the sampling failed.
    telemetry: dict = field(default_factory=dict, repr=False)

    def as_dict(self) -> dict:
        return asdict(self)


def check_request(plan, op: str, hosts: list[str], size: int, channels: int, qps: int, transport: str,
                  iters: int, timeout: float, mem_available: int | None = None, admission: int = 0,
                  chunk: int = CHUNK_BYTES) -> C.Layout:
    """Refuse, before anything starts, a collective that cannot be; its layout otherwise."""
    if op not in C.OPS:
        raise UsageError(f"unknown collective {op!r}: one of {', '.join(C.OPS)}")
    if len(hosts) < 2:
        raise UsageError(f"a collective needs at least 2 hosts, {len(hosts)} given")
    if len(set(hosts)) != len(hosts):
        raise UsageError(f"a host is named twice: {', '.join(hosts)}")
    check_hosts(plan, hosts, "collectives")
    if not 1 <= qps <= MAX_QPS:
        raise UsageError(f"{qps} QPs per link: use 1 to {MAX_QPS}")
    if not 1 <= channels <= MAX_CHANNELS:
        raise UsageError(f"{channels} channels: use 1 to {MAX_CHANNELS}")
    if transport not in MODES:
        raise UsageError(f"transport {transport!r}: use one of {', '.join(MODES)}")
    if iters < 1:
        raise UsageError(f"{iters} iterations: run at least one")
    if not 0 <= admission <= MAX_ADMISSION:
        raise UsageError(f"admission window {admission}: 0 (none) to {MAX_ADMISSION} messages per link and channel")
    if not timeout > 0:
        raise UsageError(f"timeout {timeout:g} s: give a time above 0")
    if chunk < MIN_CHUNK:
        raise UsageError(f"chunk of {chunk} B: at least one frame's payload, {MIN_CHUNK} B")
    try:
        lay = C.layout(op, size, len(hosts), channels)
    except C.CollectiveError as e:
        raise UsageError(str(e)) from None
    need = (HOST_BYTES_PER_BYTE + ORCHESTRATOR_BYTES_PER_BYTE) * len(hosts) * lay.size
    if mem_available is not None and need > MEMORY_SHARE * mem_available:
        fits = int(MEMORY_SHARE * mem_available / ((HOST_BYTES_PER_BYTE + ORCHESTRATOR_BYTES_PER_BYTE) * len(hosts)))
        raise UsageError(f"{units.format_size(lay.size)} over {len(hosts)} ranks needs about {units.format_size(need)} "
                         f"of memory and this machine has {units.format_size(mem_available)} available: at most "
                         f"{units.format_size(fits)} fits")
    return lay


def _gather(workers: list[Worker], key: str, when: str, wait: float) -> list[dict]:
    """Every worker's next ``key`` line, in order; a worker that ends first fails it at once."""
    got: dict[int, dict] = {}
    deadline = time.monotonic() + wait
    while len(got) < len(workers):
        pending = {w.proc.stdout: i for i, w in enumerate(workers) if i not in got}
        left = deadline - time.monotonic()
        ready = select.select(list(pending), [], [], max(0.0, left))[0] if left > 0 else []
        if not ready:
            late = ", ".join(workers[i].host for i in pending.values())
            raise WorkerFailed(f"the soft-NIC(s) on {late} gave no {key} within {wait:g} s {when}")
        for f in ready:
            i = pending[f]
            got[i] = workers[i].read(key, when)
    return [got[i] for i in range(len(workers))]


def _rtts(plan, pairs: list[tuple[str, str]]) -> dict[tuple[str, str], float]:
    """Each pair's RTT, measured all at once: a cross-DC ping waits a dilated RTT (seconds at a
    high dilation), and each pair's pings run in their own namespaces."""
    with ThreadPoolExecutor(max_workers=min(16, len(pairs))) as pool:
        return dict(zip(pairs, pool.map(lambda p: _path_rtt(plan, *p), pairs)))


def run(plan, op: str, hosts: list[str], size: int, channels: int = 1, qps: int = 1, transport: str = "selective",
        iters: int = 1, timeout: float = 300.0, seed: int = 1, cc: dcqcn.Profile | None = None,
        on_start=None, admission: int = 0, sampler=None, sample_s: float = 0.0,
        chunk: int = CHUNK_BYTES, rtts: dict[tuple[str, str], float] | None = None) -> CollectiveResult:
    """Run ``op`` of ``size`` bytes (nccl-tests' size, as the NICs move it) across ``hosts`` in
    ring order, ``iters`` times, and check every rank's result. The NICs send at the host
    link's rate and run ``cc`` (real units; None or ``off``: none), scaled by the time model.
    ``admission`` > 0: receivers clear that many messages per link and channel ahead (Meta's
    clear-to-send), senders write only what is cleared. ``chunk``: the bytes a message is cut
    into (each chunk goes through the steps on its own). ``rtts``: RTTs (wall s) of host pairs
    measured on this fabric before, by (src, dst); the pairs it lacks are measured and added to it
    (a bench that runs many collectives on one ring pings it once: a dilated cross-DC ping takes
    seconds). With ``sampler`` (the controller's port
    readings) and ``sample_s``, the ports are read that often through the runs.
    Every figure in the result is emulated (wall seconds, emulated bytes and rates)."""
    lay = check_request(plan, op, hosts, size, channels, qps, transport, iters, timeout, capabilities.mem_available(),
                        admission, chunk)
    ports = [_host_port(plan, h) for h in hosts]
    rate = ports[0].egress.rate_bps
    ips = [str(p.address.ip) for p in ports]
    n = len(hosts)
    pairs = [(hosts[i], hosts[(i + 1) % n]) for i in range(n)]
    # An all-to-all talks to every rank: its window is sized for the farthest.
    extra = [(hosts[0], h) for h in hosts[2:-1]] if op == "all_to_all" else []
    known = rtts if rtts is not None else {}
    missing = [p for p in pairs + extra if p not in known]
    if missing:
        known.update(_rtts(plan, missing))
    rtts = {p: known[p] for p in pairs + extra}
    hops = {f"{a}->{b}": rtts[(a, b)] for a, b in pairs}
    rtt = max(rtts.values())
    window_rtt = max(rtt, 2 * plan.spec.emulated_time(plan.spec.intra_dc_one_way_s()))
    burst = nic_burst(rate, ports[0].egress.qdisc_limit)
    tm = plan.spec.time
    running = cc.scaled(tm.byte_scale) if cc is not None and cc.enabled else None
    common = ["--op", op, "--ips", ",".join(ips), "--channels", str(channels), "--seed", str(seed),
              "--qps", str(qps), "--size", str(lay.size), "--mode", transport, "--rate", str(rate),
              "--burst", str(burst), "--rtt", str(window_rtt), "--timeout", str(timeout),
              "--cc", json.dumps(asdict(running)) if running else "", "--dilation", repr(tm.dilation),
              "--window", plan.spec.nic.window, "--admission", str(admission),
              "--chunk", str(chunk)]
    want = [hashlib.sha256(x.tobytes()).hexdigest() for x in C.expected(lay, C.inputs(lay, seed))]
    py = [sys.executable, "-m", "emulator.workload.collective_worker"]
    workers: list[Worker] = []
    runs: list[list[RunFigures]] = []
    sampling = PortSampler(sampler, sample_s) if sampler is not None and sample_s > 0 else None
    t0 = None
    try:
        for r, (h, ip) in enumerate(zip(hosts, ips)):
            workers.append(Worker(h, f"rank {r}", netns.popen(
                plan.netns(h), py + ["--rank", str(r), "--ip", ip, *common], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)))
        ready = _gather(workers, "ready", "before it was ready", 120)
        peers = {"peers": [asdict(RankReady.from_dict(x)) for x in ready]}
        for w in workers:
            w.tell(peers, "while it was being connected")
        if on_start is not None:
            on_start()
        t0 = time.monotonic()
        if sampling is not None:
            sampling.start()
        for _ in range(iters):
            for w in workers:
                w.tell("go", "at the start of a run")
            done = [RunFigures.from_dict(d) for d in _gather(workers, "done", "during the collective", timeout + 30)]
            runs.append(done)
            if not all(d.ok for d in done):
                break
        if sampling is not None:
            sampling.finish()
        for w in workers:
            w.tell("stop", "before it gave its result")
        results = [RankResult.from_dict(d) for d in _gather(workers, "result", "before it gave its result", 60)]
    finally:
        readings = sampling.stop() if sampling is not None else []
        for w in workers:
            if w.proc.poll() is None:
                w.proc.kill()
            w.proc.wait()
    telemetry = {"t0_monotonic": t0, "sample_s": sample_s, "ports": readings,
                 "ports_error": sampling.error if sampling is not None else None} if sampling is not None else {}
    complete = len(runs) == iters and all(d.ok for run_ in runs for d in run_)
    intact = complete and all(d.sha256 == want[r] for run_ in runs for r, d in enumerate(run_))
    times = [max(d.started + d.seconds for d in run_) - min(d.started for d in run_) for run_ in runs]
    mean = sum(times) / len(times) if times and complete else 0.0
    bw = C.bandwidth(op, n, lay.size, mean) if mean > 0 else None
    alpha = max(hops.values()) / 2
    qp_all = [q for res in results for q in res.qps]
    return CollectiveResult(
        op, list(hosts), lay.size, channels, qps, transport, iters, intact, complete, times, mean,
        bw.algbw_bps if bw else 0.0, bw.busbw_bps if bw else 0.0, C.BUSBW_FACTOR[op](n), rate,
        cross_dc=len({plan.node(h).dc for h in hosts}) > 1, hop_rtts_s=hops, alpha_s=alpha,
        model_s=C.alpha_beta(op, n, lay.size, rate, alpha),
        path_model_s=C.ring_path(op, [rtts[p] / 2 for p in pairs], rate, lay.size),
        rate_control=f"DCQCN {running.name}" if running else "none (line-rate pacing only)", admission=admission,
        retransmits=sum(q.retransmits for q in qp_all), timeouts=sum(q.timeouts for q in qp_all),
        data_packets=sum(q.data_packets for q in qp_all), chunk=chunk,
        ranks=[{"rank": r, "host": h, "runs": [asdict(run_[r]) for run_ in runs], "nic": res.nic,
                "qps": [asdict(q) for q in res.qps]} for r, (h, res) in enumerate(zip(hosts, results))],
        time_model=tm.as_dict(), telemetry=telemetry)
