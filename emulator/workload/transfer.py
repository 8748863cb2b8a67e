"""``backplane run transfer``: RDMA WRITEs from one or more hosts' soft-NICs into another's,
measured. Run by the CLI in the root namespace: it starts one worker process (workload.worker)
per host namespace, connects them out of band, samples the switches' ports through the
controller while the data moves, and gathers the workers' reports into a TransferResult.
"""
from __future__ import annotations

import json
import select
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass, field

from emulator.errors import MeasurementError, UsageError
from emulator.fabric import capabilities, netns
from emulator.model.plan import SWITCH_ROLES
from emulator.nic import dcqcn
from emulator.nic.rc import MODES, QpConfig
from emulator.telemetry import describe, measure
from emulator.model import units
from emulator.model.spec import FabricSpec
from emulator.workload.records import SenderReady, SenderResult, SendersReady, TargetReady, TargetResult
from emulator.workload.worker import CHUNK, nic_burst

# At most this share of the memory available may go to the transfer's buffers: each sender's
# data and the target's region for it, all held at once.
MEMORY_SHARE = 0.8
MAX_QPS = 1024
# The port sampler paces itself by the median cost of this many of its last readings.
COST_READINGS = 5

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
    telemetry: dict = field(default_factory=dict, repr=False)  # series; emulator/telemetry/report.py reads them
    time_model: dict = field(default_factory=dict)  # scale, dilation: every figure here is emulated
    # What the topology models, in real units, for judging the run (report.fidelity) and for
    # modelling it: the in-DC RTT, the host link's rate, the frame, the DCQCN profile.
    scenario: dict = field(default_factory=dict)
    # CPU seconds the soft-NIC processes ran (every sender's and the target's, each from its start
    # to its last completion), the kernel's work in their context included: what the NICs cost.
    nic_cpu_s: float = 0.0

    @property
    def goodput_per_core_bps(self) -> float:
        """Goodput per CPU core the NICs' processes kept busy (emulated bit/s)."""
        return self.goodput_bps * self.seconds / self.nic_cpu_s if self.nic_cpu_s > 0 else 0.0

    def as_dict(self) -> dict:
        return {**asdict(self), "goodput_per_core_bps": self.goodput_per_core_bps}


def _path_rtt(plan, src: str, dst: str, tries: int = 4) -> float:
    """The RTT that sizes the window: the least of a few pings, once they agree. Pings that
    waited behind a neighbour lookup (an ARP lost on a lossy path costs a second) arrive
    spaced by their interval and are not the path's RTT: measure again."""
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
    return capabilities.has_netem()


def _host_port(plan, host: str):
    return next(iter(plan.ports(host)))


def check_hosts(plan, hosts, jobs: str) -> None:
    """Every name is a host of this fabric (``jobs``, e.g. "transfers", run between hosts)."""
    for host in hosts:
        try:
            role = plan.node(host).role
        except KeyError:
            raise UsageError(f"no node {host!r} in fabric {plan.name!r}") from None
        if role != "host":
            raise UsageError(f"{host} is a {role}, not a host: {jobs} run between hosts' soft-NICs")


def check_request(plan, srcs: list[str], dst: str, size: int, qps: int, transport: str, timeout: float,
                  mem_available: int | None = None) -> None:
    """Refuse, before anything starts, a transfer that cannot be: hosts that are not hosts of
    this fabric, a host sending to itself, nothing to send, buffers that do not fit in memory."""
    if not srcs:
        raise UsageError("no sender given")
    check_hosts(plan, (*srcs, dst), "transfers")
    if dst in srcs:
        raise UsageError(f"{dst} cannot send to itself: the target must be another host")
    if len(set(srcs)) != len(srcs):
        raise UsageError(f"a sender is named twice: {', '.join(srcs)}")
    if size < 1:
        raise UsageError(f"size {size} B: a transfer moves at least one byte")
    if not 1 <= qps <= MAX_QPS:
        raise UsageError(f"{qps} QPs per sender: use 1 to {MAX_QPS}")
    if transport not in MODES:
        raise UsageError(f"transport {transport!r}: use one of {', '.join(MODES)}")
    if not timeout > 0:
        raise UsageError(f"timeout {timeout:g} s: give a time above 0")
    need = 2 * len(srcs) * size  # each sender's data, and the target's region for it
    if mem_available is not None and need > MEMORY_SHARE * mem_available:
        fits = int(MEMORY_SHARE * mem_available / (2 * len(srcs)))
        raise UsageError(f"{units.format_size(size)} from each of {len(srcs)} sender(s) needs "
                         f"{units.format_size(need)} of memory (the data at each sender and its copy at the "
                         f"target), and this machine has {units.format_size(mem_available)} available: "
                         f"at most {units.format_size(fits)} per sender fits")


def choose_profile(fabric_spec: FabricSpec, name: str | None) -> dcqcn.Profile:
    """The DCQCN profile the NICs run: the topology's with its overrides (``name`` None or the
    topology's own), or another one as its sources give it, in real units."""
    nic = fabric_spec.nic
    if name in (None, nic.dcqcn):
        return nic.dcqcn_profile(fabric_spec.links.host)
    return dcqcn.profile(name, fabric_spec.links.host)


class WorkerFailed(MeasurementError):
    """A soft-NIC process ended or stopped answering before it gave its result."""


@dataclass
class Worker:
    """One soft-NIC process of the transfer, and how to say what became of it."""

    host: str
    role: str  # "sender" or "target"
    proc: subprocess.Popen

    def ended(self) -> str:
        rc = self.proc.poll()
        if rc is None:
            try:
                rc = self.proc.wait(timeout=1.0)  # its stdout closed: it is on its way out
            except subprocess.TimeoutExpired:
                return "stopped answering"
        if rc < 0:
            try:
                return f"was killed by {signal.Signals(-rc).name}"
            except ValueError:
                return f"was killed by signal {-rc}"
        return f"exited with status {rc}"

    def last_words(self) -> str:
        """The last line it wrote to stderr (read once it has ended)."""
        if self.proc.poll() is None:
            return ""
        try:
            lines = [line.strip() for line in self.proc.stderr.read().splitlines() if line.strip()]
        except (OSError, ValueError):
            return ""
        return lines[-1][-300:] if lines else ""

    def failure(self, when: str) -> WorkerFailed:
        how = self.ended()  # first: it waits for the process, whose stderr is then complete
        words = self.last_words()
        return WorkerFailed(f"the soft-NIC on {self.host} ({self.role}) {how} {when}"
                            + (f"; its last words: {words}" if words else ""))

    def tell(self, obj: dict | str, when: str) -> None:
        try:
            self.proc.stdin.write((obj if isinstance(obj, str) else json.dumps(obj)) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            raise self.failure(when) from None

    def read(self, key: str, when: str) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise self.failure(when)
        try:
            return json.loads(line)[key]
        except (ValueError, KeyError, TypeError):
            raise WorkerFailed(f"the soft-NIC on {self.host} ({self.role}) answered {line.strip()[:200]!r} "
                               f"{when}, not its {key}") from None


def _ports_meta(plan) -> dict:
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
        # Wall seconds the last readings took: their median sets the pace, so one reading held
        # up behind the controller's own work (a convergence) does not stretch the next gap.
        self._costs: deque[float] = deque(maxlen=COST_READINGS)
        self._stop_event = threading.Event()

    def start(self) -> None:
        """The first reading now, before the data starts (the series' baseline), then the rest
        on the thread."""
        if self._read():
            super().start()

    def _read(self) -> bool:
        began = time.monotonic()
        try:
            self.readings.append(self.sample())
        except Exception as e:  # noqa: BLE001 - reported with the result, never a crash
            self.error = f"{type(e).__name__}: {e}"
            return False
        self._costs.append(time.monotonic() - began)
        return True

    def run(self) -> None:
        # Reading the maps costs the controller CPU the fabric needs (20x more in a VM without
        # KVM): never spend more than a fifth of the time on it.
        while not self._stop_event.wait(max(self.period, 4 * statistics.median(self._costs))):
            if not self._read():
                return

    def finish(self) -> list[dict]:
        """Stop, then one last reading: the series ends after what it measured, not up to a
        period (four readings' cost, when slow) before."""
        self.stop()
        if self.error is None:
            self._read()
        return self.readings

    def stop(self) -> list[dict]:
        self._stop_event.set()
        if self.ident is not None:  # it may never have started (a failure during set-up)
            self.join(5)
        return self.readings


def _results(senders: list[Worker], target: Worker, wait: float) -> list[dict]:
    """Every sender's result, in order. Any worker that ends first fails the transfer at once,
    named with how it ended: a dead target would otherwise leave the senders retrying."""
    got: dict[int, dict] = {}
    deadline = time.monotonic() + wait
    while len(got) < len(senders):
        pending = {w.proc.stdout: i for i, w in enumerate(senders) if i not in got}
        left = deadline - time.monotonic()
        ready = select.select([*pending, target.proc.stdout], [], [], max(0.0, left))[0] if left > 0 else []
        if not ready:
            late = ", ".join(senders[i].host for i in pending.values())
            raise WorkerFailed(f"the soft-NIC(s) on {late} gave no result within {wait:g} s")
        if target.proc.stdout in ready:  # it says nothing until told to stop: this is its end
            raise target.failure("during the transfer")
        for f in ready:
            i = pending[f]
            got[i] = senders[i].read("result", "during the transfer")
    return [got[i] for i in range(len(senders))]


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
    srcs = [src] if isinstance(src, str) else list(src)
    check_request(plan, srcs, dst, size, qps, transport, timeout, capabilities.mem_available())
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
    py = [sys.executable, "-m", "emulator.workload.worker"]
    workers: list[Worker] = []

    def start(host: str, role: str, argv: list[str]) -> tuple[Worker, dict]:
        w = Worker(host, role, netns.popen(plan.netns(host), py + argv, stdin=subprocess.PIPE,
                                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        workers.append(w)
        return w, w.read("ready", "before it was ready")

    sampling = PortSampler(sampler, sample_s) if sampler is not None and sample_s > 0 else None
    try:
        server, ready = start(dst, "target", ["serve", "--ip", dst_ip, "--peer", ",".join(src_ips), *common])
        s_ready = TargetReady.from_dict(ready)
        clients = []
        for i, (h, ip) in enumerate(zip(srcs, src_ips)):
            w, ready = start(h, "sender", ["send", "--ip", ip, "--peer", dst_ip, "--chunk", str(chunk),
                                           "--seed", str(seed + i), *common])
            clients.append((w, SenderReady.from_dict(ready)))
        if sampling is not None:
            sampling.start()
        if on_start is not None:
            on_start()
        server.tell(asdict(SendersReady([r for _, r in clients])), "while it was being connected")
        for (w, _), flow in zip(clients, s_ready.flows):
            w.tell(asdict(flow), "while it was being connected")
        sent = [SenderResult.from_dict(r) for r in _results([w for w, _ in clients], server, timeout + 30)]
        server.tell("stop", "before it gave its result")
        if not select.select([server.proc.stdout], [], [], 30)[0]:
            raise WorkerFailed(f"the soft-NIC on {dst} (target) gave no result within 30 s of the senders' end")
        got = TargetResult.from_dict(server.read("result", "before it gave its result"))
    finally:
        readings = sampling.stop() if sampling is not None else []
        for w in workers:
            if w.proc.poll() is None:
                w.proc.kill()
            w.proc.wait()
    flows = []
    for h, r, digest in zip(srcs, sent, got.sha256):
        flows.append({"src": h, "intact": r.sha256 == digest and got.complete, "complete": r.complete,
                      "started_s": r.started_s, "seconds": r.seconds, "goodput_bps": r.goodput_bps, "cpu_s": r.cpu_s,
                      **{k: sum(getattr(q, k) for q in r.qps)
                         for k in ("data_packets", "retransmits", "timeouts", "cnps_received")}})
    begin = min(f["started_s"] for f in flows)
    span = max(f["started_s"] + f["seconds"] for f in flows) - begin
    complete = all(f["complete"] for f in flows)
    telemetry = {"t0_monotonic": t0, "sample_s": sample_s, "senders": {h: r.telemetry for h, r in zip(srcs, sent)},
                 "receiver": got.telemetry, "ports": readings,
                 "ports_error": sampling.error if sampling is not None else None,
                 # Where the port readings stop when the sampler failed (seconds from t0).
                 "ports_cut_off_s": (readings[-1]["t"] - t0 if readings else None)
                 if sampling is not None and sampling.error else None,
                 "ports_meta": _ports_meta(plan), "ecn": describe.ecn_thresholds(plan.spec)}
    return TransferResult(
        ",".join(srcs), dst, transport, size, qps, intact=all(f["intact"] for f in flows), complete=complete,
        seconds=span, goodput_bps=len(srcs) * size * 8 / span if complete and span > 0 else 0.0, line_rate_bps=rate,
        rtt_s=rtt, rate_control=f"DCQCN {running.name}" if running else "none (line-rate pacing only)",
        retransmits=sum(f["retransmits"] for f in flows), timeouts=sum(f["timeouts"] for f in flows),
        data_packets=sum(f["data_packets"] for f in flows), cnps=sum(f["cnps_received"] for f in flows),
        sender=sent[0].as_dict(), receiver=got.as_dict(), senders=[r.as_dict() for r in sent], flows=flows, dcqcn=asdict(running) if running else None,
        telemetry=telemetry, time_model=tm.as_dict(),
        scenario={"intra_dc_rtt_s": 2 * plan.spec.intra_dc_one_way_s(), "host_rate_bps": plan.spec.links.host,
                  "frame_bytes": plan.spec.mtu + 14, "dcqcn": asdict(cc) if running else None,
                  "intra_dc_delay_applied": plan.intra_delay_applies(_has_netem()),
                  # Whether a sender's path crosses the long-haul paths (its RTT is then the WAN's).
                  "cross_dc": any(plan.node(h).dc != plan.node(dst).dc for h in srcs),
                  # The switch port into the target: the queue an incast shares.
                  "bottleneck": f"{last_hop.node}:{last_hop.ifname}", "nic_burst_bytes": burst,
                  "window": plan.spec.nic.window,
                  "ack_every": QpConfig().ackreq_every},
        nic_cpu_s=sum(r.cpu_s for r in sent) + got.cpu_s)
