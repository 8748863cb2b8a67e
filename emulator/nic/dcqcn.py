"""DCQCN (Zhu et al., SIGCOMM 2015): the notification point and the reaction point, pure and
driven by an injected clock, and the named parameter profiles the sources disagree on.

Reaction point (the sender, per QP), with current rate Rc, target rate Rt and alpha:
  - on a CNP: Rt = Rc, Rc = Rc (1 - alpha/2), alpha = (1-g) alpha + g; the increase counters
    (timer stages i, byte stages j) and the byte count restart;
  - every K without a CNP: alpha = (1-g) alpha;
  - an increase event each time the timer (period T) fires (i += 1) and each time B bytes have
    been sent (j += 1; at most once per packet): fast recovery while max(i, j) < F
    (Rc = (Rt + Rc)/2), hyper increase when min(i, j) >= F (Rt += R_HAI, then Rc = (Rt + Rc)/2),
    additive otherwise (Rt += R_AI, then the same); rates stay within [min rate, line rate].
Notification point (the receiver, per QP): at most one CNP per N for CE-marked packets.

Profiles (rates in real, unscaled bit/s; `scaled` turns them into the emulation's):
  - ``paper``: the paper's values for 40G (Kmin 5 KB, Kmax 200 KB, Pmax 1%, g 1/256, N 50 us,
    K 55 us, T 55 us, B 10 MB, F 5, R_AI 40 Mb/s). The paper gives no R_HAI or minimum rate:
    R_HAI is 10 x R_AI (hpcc-ns3's ratio) and the minimum 1 Mb/s (NVIDIA's), both overridable.
  - ``nvidia``: ConnectX defaults (sysfs ecn/roce_rp and roce_np): g 5/1024 (dce_tcp_g 1019),
    alpha period 1 us (dce_tcp_rtt), T 300 us (rpg_time_reset), B 32767 B (rpg_byte_reset),
    F 1 (rpg_threshold), R_AI 5 Mb/s, R_HAI 50 Mb/s, min 1 Mb/s, N 4 us
    (min_time_between_cnps); the switch thresholds are the topology's.
  - ``hpcc-ns3``: the DCQCN model of the HPCC simulator (alibaba-edu/High-Precision-Congestion-
    Control, simulation/run.py, cc=dcqcn), timer only: alpha period 1 us, T 300 us, g 1/256,
    F 1, R_AI 5 Mb/s and R_HAI 50 Mb/s per 25 Gb/s of line rate, min 1 Gb/s, Kmin 100 KB and
    Kmax 400 KB per 25 Gb/s, Pmax 20%.
  - ``off``: no rate control (what Meta ran at 400G, with PFC only).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

KB, MB = 1000, 1000 ** 2
MBPS, GBPS = 1e6, 1e9
EPS = 1e-9  # s: events this close count as simultaneous (float sums of microseconds drift)


@dataclass(frozen=True)
class Profile:
    name: str
    enabled: bool = True
    g: float = 1 / 256
    cnp_interval_s: float = 50e-6  # N: the NP sends at most one CNP per QP this often
    alpha_period_s: float = 55e-6  # K: alpha decays once per period without a CNP
    timer_s: float = 55e-6  # T: the rate-increase timer
    byte_counter: int = 10 * MB  # B: an increase event per this many bytes sent (0: timer only)
    fast_recovery: int = 5  # F
    rate_ai_bps: float = 40 * MBPS
    rate_hai_bps: float = 400 * MBPS
    min_rate_bps: float = 1 * MBPS
    kmin: int | None = 5 * KB  # switch ECN thresholds (None: the topology's)
    kmax: int | None = 200 * KB
    pmax: float | None = 0.01

    def scaled(self, scale: float) -> "Profile":
        """Rates and byte counts as the emulation runs them (times are kept: buffers keep their
        size in time)."""
        def size(v: int | None) -> int | None:
            return None if v is None else max(1, round(v * scale))

        return replace(self, byte_counter=size(self.byte_counter) if self.byte_counter else 0,
                       rate_ai_bps=self.rate_ai_bps * scale, rate_hai_bps=self.rate_hai_bps * scale,
                       min_rate_bps=self.min_rate_bps * scale, kmin=size(self.kmin), kmax=size(self.kmax))


def _hpcc_ns3(line_rate_bps: float) -> Profile:
    per25 = line_rate_bps / (25 * GBPS)
    return Profile("hpcc-ns3", g=1 / 256, cnp_interval_s=50e-6, alpha_period_s=1e-6, timer_s=300e-6,
                   byte_counter=0, fast_recovery=1, rate_ai_bps=5 * MBPS * per25, rate_hai_bps=50 * MBPS * per25,
                   min_rate_bps=1 * GBPS, kmin=round(100 * KB * per25), kmax=round(400 * KB * per25), pmax=0.2)


PROFILE_NAMES = ("paper", "nvidia", "hpcc-ns3", "off")


def profile(name: str, line_rate_bps: float, overrides: dict | None = None) -> Profile:
    """The named profile for a NIC of ``line_rate_bps`` (real, unscaled), with ``overrides``
    (field name -> value) applied field by field."""
    if name == "paper":
        p = Profile("paper")
    elif name == "nvidia":
        p = Profile("nvidia", g=5 / 1024, cnp_interval_s=4e-6, alpha_period_s=1e-6, timer_s=300e-6,
                    byte_counter=32767, fast_recovery=1, rate_ai_bps=5 * MBPS, rate_hai_bps=50 * MBPS,
                    min_rate_bps=1 * MBPS, kmin=None, kmax=None, pmax=None)
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
        self.alpha = 1.0  # the paper starts at 1: the first CNP halves the rate
        self.i = self.j = 0
        self.bytes = 0
        self.cnps = 0
        self._next_alpha = math.inf  # alpha decays only after a CNP has set it
        self._next_timer = math.inf  # the increase timer runs only while below line rate
        self.now = now
        self._start = now
        self._bits = 0.0  # the integral of Rc over time: mean rates between any two readings
        self._bits_t = now

    @property
    def rate_bps(self) -> float:
        return self.rc if self.p.enabled else self.line

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
        self._account(now)
        self.cnps += 1
        self.rt = self.rc
        self.rc = max(self.p.min_rate_bps, self.rc * (1 - self.alpha / 2))
        self.alpha = (1 - self.p.g) * self.alpha + self.p.g
        self.i = self.j = 0
        self.bytes = 0
        self._next_alpha = now + self.p.alpha_period_s
        self._next_timer = now + self.p.timer_s

    def on_sent(self, nbytes: int, now: float) -> None:
        if not self.p.enabled:
            return
        self.advance(now)
        if not self.p.byte_counter or self.rc >= self.line:
            return
        self._account(now)
        self.bytes += nbytes
        if self.bytes >= self.p.byte_counter:
            # One stage per packet at most, as a NIC checks its counter once per packet sent:
            # scaled down, B can be smaller than one frame (NVIDIA's 32767 B is 33 B at scale
            # 0.001), and a 4 KB frame must not count as 125 stages.
            self.bytes %= self.p.byte_counter
            self.j += 1
            self._increase()

    def advance(self, now: float) -> None:
        """Fire every alpha decay and timer event due by ``now``, in time order (alpha first
        when both fall on the same instant). Runs of alpha decays are applied in one step: at
        a 1 us period (NVIDIA's) one by one would cost a million steps a second."""
        if not self.p.enabled:
            return
        while self._next_timer <= now + EPS:
            t = self._next_timer
            self._decay_through(t)
            self._account(t)
            self.i += 1
            self._next_timer += self.p.timer_s
            self._increase()
        self._decay_through(now)
        self.now = max(self.now, now)

    def _decay_through(self, t: float) -> None:
        if self._next_alpha <= t + EPS:
            n = int((t + EPS - self._next_alpha) // self.p.alpha_period_s) + 1
            self.alpha *= (1 - self.p.g) ** n
            self._next_alpha += n * self.p.alpha_period_s

    def _increase(self) -> None:
        p = self.p
        if max(self.i, self.j) < p.fast_recovery:
            pass  # fast recovery: towards the rate before the cut
        elif min(self.i, self.j) >= p.fast_recovery:
            self.rt = min(self.line, self.rt + p.rate_hai_bps)
        else:
            self.rt = min(self.line, self.rt + p.rate_ai_bps)
        self.rc = min(self.line, (self.rt + self.rc) / 2)
        if self.rc >= self.line:
            self._next_timer = math.inf  # back at line rate: nothing left to recover


class NotificationPoint:
    """One QP's receiver: says whether a CE-marked packet now earns a CNP."""

    def __init__(self, p: Profile) -> None:
        self.p = p
        self._last = -math.inf
        self.cnps = 0
        self.ce_packets = 0

    def on_ce(self, now: float) -> bool:
        self.ce_packets += 1
        if not self.p.enabled or now - self._last < self.p.cnp_interval_s - EPS:
            return False
        self._last = now
        self.cnps += 1
        return True


class RatePacer:
    """The pacer a QP's ``pace`` hook calls before each packet: a token bucket at the reaction
    point's current rate, ``burst`` bytes deep. Every byte it lets go also feeds the byte
    counter."""

    def __init__(self, rp: ReactionPoint, burst: int, overhead: int = 4 + 42) -> None:
        self.rp = rp
        self.burst = burst
        self.overhead = overhead  # ICRC, UDP, IPv4, Ethernet: the hook is told the transport bytes
        self.tokens = float(burst)
        self.last: float | None = None

    def _refill(self, now: float) -> None:
        if self.last is not None and now > self.last:
            self.tokens = min(self.burst, self.tokens + (now - self.last) * self.rp.rate_bps / 8)
        self.last = now if self.last is None else max(self.last, now)

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
