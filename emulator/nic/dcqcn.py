"""DCQCN (Zhu et al., SIGCOMM 2015): the notification point and the reaction point, pure and
driven by an injected clock, and the named profiles of the sources, which disagree in their
rules as well as their numbers.

Reaction point (the sender, per QP), with current rate Rc, target rate Rt and alpha:
  - a CNP cuts: Rt = Rc (always, or only if the rate rose since the last cut: ``clamp``),
    Rc = max(min rate, Rc (1 - alpha/2)), never below ``min_dec_factor`` x the old Rc; the
    increase stages and the byte count restart, and the increase timer starts. The cut happens
    at once (``rate_decrease_period_s`` 0), or at most once per rate-decrease period, at the
    period's tick, if a CNP came during it (NVIDIA's rate_reduce_monitor_period, HPCC ns-3's
    RATE_DECREASE_INTERVAL).
  - alpha: ``on_cnp`` (the paper): alpha = (1-g) alpha + g on each CNP, after the cut, and
    alpha = (1-g) alpha every K without a CNP; ``periodic`` (NVIDIA, HPCC ns-3): every K,
    free-running from the first CNP, alpha = (1-g) alpha + g x [a CNP came since the last tick].
    The first CNP sets alpha to ``initial_alpha`` without a bump.
  - increase events: the timer (every T after the last cut) and the byte counter (each B bytes
    sent, at most once per packet, as a NIC checks it per packet). With i (timer) and j (byte)
    the events already done since the cut (a disabled byte counter counts as caught up):
    fast recovery while max(i, j) < F (Rc = (Rt + Rc)/2: F events, as QCN and htsim have it),
    hyper increase when min(i, j) >= F (``stage_rule`` ``qcn``: the paper) or > F (``mlx``:
    HPCC ns-3's RateIncEventMlx, stage < F fast, = F additive, > F hyper; NVIDIA's firmware
    descends from it), additive otherwise (Rt += R_AI, then Rc = (Rt + Rc)/2). The hyper step is
    R_HAI, or R_HAI x (min(i, j) - F + 1) with ``hyper_step`` ``stage`` (the paper's authors'
    simulator and htsim). Rates stay within [min rate, line rate].
Notification point (the receiver, per QP): CNPs for CE-marked data, at most one per N (N = 0:
one per marked packet). With ``cnp_defer`` a mark inside N is not dropped: one CNP goes when N
has passed (the paper: "at most one CNP every N us for the flow, if any packet that arrives
within that time window was marked").
The NICs' own processing, ``cnp_delay_s`` (marked packet in, CNP out) and ``reaction_delay_s``
(CNP in, rate changed), is applied by the socket loop on its clock.

Profiles (rates in real, unscaled bit/s; `scaled` turns them into the soft-NIC's units). Where
each value and rule comes from (checked against the sources; the paper's PDF through its
authors' own simulator, bobzhuyb/ns3-rdma, and htsim's DCQCN, which agree on what is below):
  - ``paper``: 40G values: Kmin 5 KB, Kmax 200 KB, Pmax 1%, g 1/256, N 50 us (deferred marks),
    K 55 us, T 55 us, B 10 MB, F 5, R_AI 40 Mb/s; alpha on each CNP; cut at once; Rt = Rc always;
    R_HAI 200 Mb/s, minimum rate 100 Mb/s and the stage-grown hyper step are the authors'
    simulator's (ns3-rdma mix/config.txt, qbb-net-device.cc); its QCN halving of T and B in
    hyper increase is not modelled.
  - ``nvidia``: ConnectX-4 and later firmware defaults (mlxconfig/sysfs roce_rp, roce_np; the
    DOCA "DCQCN CC Parameters" page): g 5/1024 (dce_tcp_g 1019 read as the weight kept; the
    firmware layout text reads it the other way, 1019/1024: disputed), alpha period 1 us
    (dce_tcp_rtt) periodic, initial alpha 1023/1024, at most one cut per 4 us
    (rate_reduce_monitor_period), never below 50% of the rate (rpg_min_dec_fac), Rt clamped only
    after an increase (clamp_tgt_rate 0, clamp_tgt_rate_after_time_inc 1), T 300 us
    (rpg_time_reset), B 32767 B (rpg_byte_reset), F 1 (rpg_threshold: "the number of times
    rpByteStage or rpTimeStage can count before the state machine advances", so the first event
    is fast recovery, as in HPCC's Mellanox model), R_AI 5 Mb/s, R_HAI
    50 Mb/s, min 1 Mb/s, N 4 us (min_time_between_cnps; documented "from the port": per QP
    here, an assumption); no switch thresholds (the topology's).
  - ``hpcc-ns3``: the HPCC simulator's DCQCN (alibaba-edu/High-Precision-Congestion-Control,
    rdma-hw.cc CcMode 1 "Mellanox's version", run.py cc=dcqcn): a CNP for every marked packet
    (a flag on its ACK), alpha periodic every 1 us from the first CNP (which sets alpha to 1 and
    does not cut), at most one cut per 4 us on a grid from the first CNP, Rt clamped only after
    an increase, timer only (T 300 us), one stage counter (F 1: fast recovery, additive, then
    hyper), g 1/256, R_AI 5 Mb/s and R_HAI 50 Mb/s per 25 Gb/s of line rate, min 1 Gb/s, Kmin
    100 KB and Kmax 400 KB per 25 Gb/s (Alibaba's production settings), Pmax 20%.
  - ``off``: no rate control (what Meta ran at 400G, with PFC only).
No source gives a NIC's processing delays (HPCC's model has none; NVIDIA says CNPs are made in
hardware): every profile's are 0, and the soft-NIC's own lag is measured and judged instead.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

KB, MB = 1000, 1000 ** 2
MBPS, GBPS = 1e6, 1e9
EPS = 1e-9  # s: events this close count as simultaneous (float sums of microseconds drift)
ALPHA_RULES = ("on_cnp", "periodic")
CLAMPS = ("always", "after_increase")
STAGE_RULES = ("qcn", "mlx")
HYPER_STEPS = ("constant", "stage")


@dataclass(frozen=True)
class Profile:
    name: str
    enabled: bool = True
    g: float = 1 / 256
    cnp_interval_s: float = 50e-6  # N: the NP sends at most one CNP per QP this often (0: per mark)
    alpha_period_s: float = 55e-6  # K: alpha's decay (on_cnp) or update (periodic) period
    timer_s: float = 55e-6  # T: the rate-increase timer
    byte_counter: int = 10 * MB  # B: an increase event per this many bytes sent (0: timer only)
    fast_recovery: int = 5  # F
    rate_ai_bps: float = 40 * MBPS
    rate_hai_bps: float = 200 * MBPS
    min_rate_bps: float = 100 * MBPS
    kmin: int | None = 5 * KB  # switch ECN thresholds (None: the topology's)
    kmax: int | None = 200 * KB
    pmax: float | None = 0.01
    cnp_delay_s: float = 0.0  # the NP's processing: a marked packet's arrival to its CNP leaving
    reaction_delay_s: float = 0.0  # the RP's processing: a CNP's arrival to the rate change
    # Rules (see the module's docstring).
    cnp_defer: bool = True  # a mark inside N gets one CNP when N has passed (else it gets none)
    alpha_rule: str = "on_cnp"
    initial_alpha: float = 1.0
    rate_decrease_period_s: float = 0.0  # 0: every CNP cuts at once
    clamp: str = "always"
    min_dec_factor: float = 0.0  # a cut leaves at least this share of the rate (0: no floor)
    stage_rule: str = "qcn"
    hyper_step: str = "stage"

    def __post_init__(self) -> None:
        for name, allowed in (("alpha_rule", ALPHA_RULES), ("clamp", CLAMPS), ("stage_rule", STAGE_RULES),
                              ("hyper_step", HYPER_STEPS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"DCQCN {name} {getattr(self, name)!r}: use one of {', '.join(allowed)}")

    def scaled(self, byte_scale: float) -> "Profile":
        """Rates and byte counts as the soft-NIC runs them, ``byte_scale`` = scale x dilation:
        its clock is virtual (wall / dilation), so times are kept and a rate is emulated bytes
        per virtual second, the real rate x scale x dilation, like the bytes."""
        def size(v: int | None) -> int | None:
            return None if v is None else max(1, round(v * byte_scale))

        return replace(self, byte_counter=size(self.byte_counter) if self.byte_counter else 0,
                       rate_ai_bps=self.rate_ai_bps * byte_scale, rate_hai_bps=self.rate_hai_bps * byte_scale,
                       min_rate_bps=self.min_rate_bps * byte_scale, kmin=size(self.kmin), kmax=size(self.kmax))


def _hpcc_ns3(line_rate_bps: float) -> Profile:
    per25 = line_rate_bps / (25 * GBPS)
    return Profile("hpcc-ns3", g=1 / 256, cnp_interval_s=0.0, cnp_defer=False, alpha_period_s=1e-6,
                   alpha_rule="periodic", initial_alpha=1.0, rate_decrease_period_s=4e-6, clamp="after_increase",
                   timer_s=300e-6, byte_counter=0, fast_recovery=1, stage_rule="mlx", hyper_step="constant",
                   rate_ai_bps=5 * MBPS * per25, rate_hai_bps=50 * MBPS * per25, min_rate_bps=1 * GBPS,
                   kmin=round(100 * KB * per25), kmax=round(400 * KB * per25), pmax=0.2)


PROFILE_NAMES = ("paper", "nvidia", "hpcc-ns3", "off")


def profile(name: str, line_rate_bps: float, overrides: dict | None = None) -> Profile:
    """The named profile for a NIC of ``line_rate_bps`` (real, unscaled), with ``overrides``
    (field name -> value) applied field by field."""
    if name == "paper":
        p = Profile("paper")
    elif name == "nvidia":
        p = Profile("nvidia", g=5 / 1024, cnp_interval_s=4e-6, cnp_defer=False, alpha_period_s=1e-6,
                    alpha_rule="periodic", initial_alpha=1023 / 1024, rate_decrease_period_s=4e-6,
                    clamp="after_increase", min_dec_factor=0.5, timer_s=300e-6, byte_counter=32767,
                    fast_recovery=1, stage_rule="mlx", hyper_step="constant", rate_ai_bps=5 * MBPS,
                    rate_hai_bps=50 * MBPS, min_rate_bps=1 * MBPS, kmin=None, kmax=None, pmax=None)
    elif name == "hpcc-ns3":
        p = _hpcc_ns3(line_rate_bps)
    elif name == "off":
        p = Profile("off", enabled=False, kmin=None, kmax=None, pmax=None)
    else:
        raise ValueError(f"DCQCN profile {name!r}: use one of {', '.join(PROFILE_NAMES)}")
    if overrides:
        known = {f.name for f in fields(Profile)} - {"name"}
        bad = sorted(set(overrides) - known)
        if bad:
            raise ValueError(f"DCQCN profile {name!r} has no field {', '.join(bad)} (fields: {', '.join(sorted(known))})")
        p = replace(p, **overrides)
    return p


class ReactionPoint:
    """One QP's sending rate. Call ``advance(now)`` (or any event, which advances first) as time
    passes; ``rate_bps`` is what the pacer enforces."""

    def __init__(self, p: Profile, line_rate_bps: float, now: float = 0.0) -> None:
        self.p = p
        self.line = line_rate_bps
        self.rc = self.rt = line_rate_bps
        self.alpha = p.initial_alpha
        self.i = self.j = 0
        self.bytes = 0
        self.cnps = 0  # CNPs received
        self.cuts = 0  # rate decreases made (fewer than CNPs with a rate-decrease period)
        self._seen = False  # a first CNP has come: periodic alpha and the decrease grid run
        self._alpha_flag = False  # periodic: a CNP came since the last alpha tick
        self._cut_flag = False  # a CNP came since the last rate-decrease tick
        self._next_alpha = math.inf  # alpha's next decay (on_cnp: only after a CNP) or tick
        self._next_cut = math.inf  # the next rate-decrease tick (periodic cuts)
        self._next_timer = math.inf  # the increase timer runs only after a cut, below line rate
        self.now = now
        self._start = now
        self._bits = 0.0  # the integral of Rc over time: mean rates between any two readings
        self._bits_t = now

    @property
    def rate_bps(self) -> float:
        return self.rc if self.p.enabled else self.line

    def next_change(self) -> float:
        """When the rate may next change by itself (its increase timer or a decrease tick with
        a CNP pending): a loop sleeping until a slow rate's next packet wakes then instead."""
        if not self.p.enabled:
            return math.inf
        return min(self._next_timer, self._next_cut if self._cut_flag else math.inf)

    def allowed_bits(self, now: float) -> float:
        """The integral of the rate from the start to ``now``: what the QP may have sent."""
        if not self.p.enabled:
            return self.line * (now - self._start)
        self.advance(now)
        self._account(now)
        return self._bits

    def _account(self, t: float) -> None:
        if t > self._bits_t:
            self._bits += self.rc * (t - self._bits_t)
            self._bits_t = t

    def on_cnp(self, now: float) -> None:
        if not self.p.enabled:
            return
        self.advance(now)
        p = self.p
        self.cnps += 1
        if not self._seen:
            self._seen = True
            if p.alpha_rule == "periodic":
                self.alpha = p.initial_alpha  # the first CNP sets alpha; the ticks start now
                self._next_alpha = now + p.alpha_period_s
            if p.rate_decrease_period_s:
                # Just after the alpha tick of the same instant (HPCC ns-3 adds 1 ns for that).
                self._next_cut = now + p.rate_decrease_period_s + 2 * EPS
        elif p.alpha_rule == "periodic":
            self._alpha_flag = True
        if p.rate_decrease_period_s:
            self._cut_flag = True
        else:
            self._cut(now)
        if p.alpha_rule == "on_cnp":  # after the cut, which took the alpha from before
            self.alpha = (1 - p.g) * self.alpha + p.g
            self._next_alpha = now + p.alpha_period_s

    def _cut(self, t: float) -> None:
        p = self.p
        self._account(t)
        self.cuts += 1
        if p.clamp == "always" or self.i or self.j:
            self.rt = self.rc
        old = self.rc
        # Never below the minimum rate (unless already below it) nor the decrease factor's floor.
        self.rc = min(old, max(p.min_rate_bps, old * (1 - self.alpha / 2), p.min_dec_factor * old))
        self.i = self.j = 0
        self.bytes = 0
        self._next_timer = t + p.timer_s

    def on_sent(self, nbytes: int, now: float) -> None:
        if not self.p.enabled:
            return
        self.advance(now)
        if not self.p.byte_counter or self.rc >= self.line or not self.cuts:
            return
        self._account(now)
        self.bytes += nbytes
        if self.bytes >= self.p.byte_counter:
            # One stage per packet at most, as a NIC checks its counter once per packet sent:
            # scaled down, B can be smaller than one frame (NVIDIA's 32767 B is 33 B at scale
            # 0.001), and a 4 KB frame must not count as 125 stages.
            self.bytes %= self.p.byte_counter
            self._increase()
            self.j += 1

    def advance(self, now: float) -> None:
        """Fire every alpha, rate-decrease and timer event due by ``now``, in time order (alpha
        first, then a cut, then the timer, when they fall on the same instant). Runs of alpha
        ticks without a CNP are applied in one step: at NVIDIA's 1 us one by one would cost a
        million steps a second."""
        if not self.p.enabled:
            return
        p = self.p
        while True:
            t = min(self._next_cut, self._next_timer)
            if t > now + EPS:
                break
            self._alpha_through(t)
            if self._next_cut <= t:
                if self._cut_flag:
                    self._cut_flag = False
                    self._cut(self._next_cut)
                    self._next_cut += p.rate_decrease_period_s
                else:  # quiet periods cut nothing: straight to the first tick after ``now``
                    period = p.rate_decrease_period_s
                    self._next_cut += (math.floor((now + EPS - self._next_cut) / period) + 1) * period
            else:
                self._account(t)
                self._next_timer += p.timer_s
                self._timer_stage()
        self._alpha_through(now)
        self.now = max(self.now, now)

    def _alpha_through(self, t: float) -> None:
        """Alpha's ticks up to ``t``: the first one after a CNP (periodic) counts the CNP, the
        rest decay."""
        if self._next_alpha > t + EPS:
            return
        p = self.p
        if self._alpha_flag:
            self._alpha_flag = False
            self.alpha = (1 - p.g) * self.alpha + p.g
            self._next_alpha += p.alpha_period_s
            if self._next_alpha > t + EPS:
                return
        n = int((t + EPS - self._next_alpha) // p.alpha_period_s) + 1
        self.alpha *= (1 - p.g) ** n
        self._next_alpha += n * p.alpha_period_s

    def _timer_stage(self) -> None:
        self._increase()  # decided on the stages done before this one, then counted
        self.i += 1

    def _increase(self) -> None:
        p = self.p
        hi, lo = (max(self.i, self.j), min(self.i, self.j)) if p.byte_counter else (self.i, self.i)
        fast = hi < p.fast_recovery
        hyper = lo >= p.fast_recovery if p.stage_rule == "qcn" else lo > p.fast_recovery
        stages = lo - p.fast_recovery + 1
        if fast:
            pass  # fast recovery: towards the rate before the cut
        elif hyper:
            self.rt = min(self.line, self.rt + p.rate_hai_bps * (stages if p.hyper_step == "stage" else 1))
        else:
            self.rt = min(self.line, self.rt + p.rate_ai_bps)
        self.rc = min(self.line, (self.rt + self.rc) / 2)
        if self.rc >= self.line:
            self._next_timer = math.inf  # back at line rate: nothing left to recover


class NotificationPoint:
    """One QP's receiver: says whether and when a CE-marked packet earns a CNP."""

    def __init__(self, p: Profile) -> None:
        self.p = p
        self._last = -math.inf  # when the last CNP went, or the deferred one will
        self.cnps = 0
        self.ce_packets = 0

    def on_ce(self, now: float) -> float | None:
        """The time a CNP for this mark should leave (``now``, or later when deferred), or None
        when it earns none."""
        self.ce_packets += 1
        p = self.p
        if not p.enabled:
            return None
        if now >= self._last + p.cnp_interval_s - EPS:
            self._last = now
        elif p.cnp_defer and self._last <= now + EPS:
            self._last += p.cnp_interval_s  # one CNP when N has passed covers the marks until then
        else:
            return None
        self.cnps += 1
        return self._last


class RatePacer:
    """The pacer a QP's ``pace`` hook calls before each packet: a token bucket at the reaction
    point's current rate, ``burst`` bytes deep, or ``burst_s`` seconds of the current rate when
    that is more. A NIC paces packet by packet; a loop that wakes late may catch up on what it
    was owed only within that depth, so what leaves stays close to the rate at the granularity
    that matters (a burst of the whole loop's lag, at line rate, would fill a switch queue that
    a real NIC's pacing leaves empty). Every byte it lets go also feeds the byte counter."""

    def __init__(self, rp: ReactionPoint, burst: int, overhead: int = 4 + 42, burst_s: float = 0.0) -> None:
        self.rp = rp
        self.burst = burst
        self.burst_s = burst_s
        self.overhead = overhead  # ICRC, UDP, IPv4, Ethernet: the hook is told the transport bytes
        self.tokens = float(burst)
        self.last: float | None = None
        self._allowed = 0.0  # the rate's integral at ``last``: tokens follow every cut and rise

    def _refill(self, now: float) -> None:
        allowed = self.rp.allowed_bits(now) if self.last is None or now > self.last else self._allowed
        if self.last is not None and now > self.last:
            cap = max(self.burst, self.rp.rate_bps / 8 * self.burst_s)
            self.tokens = min(cap, self.tokens + (allowed - self._allowed) / 8)
        if self.last is None or now > self.last:
            self.last, self._allowed = now, allowed

    def __call__(self, now: float, nbytes: int) -> bool:
        self.rp.advance(now)
        self._refill(now)
        if self.tokens < 0:
            return False
        self.tokens -= nbytes + self.overhead
        self.rp.on_sent(nbytes + self.overhead, now)
        return True

    def wait(self, now: float) -> float:
        """Seconds until the next packet may go (0: now)."""
        self._refill(now)
        return 0.0 if self.tokens >= 0 else -self.tokens * 8 / self.rp.rate_bps
