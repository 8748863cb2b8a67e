"""Mechanics of the independent DCQCN incast reference model (emulator/reference/incast.py).

Expected values are worked out by hand from the model's stated delays and rules, not
read back from the model.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from emulator.reference.incast import ALPHA
from emulator.reference.incast import Dcqcn
from emulator.reference.incast import DEC
from emulator.reference.incast import ecn_probability
from emulator.reference.incast import hpcc_ns3
from emulator.reference.incast import hpcc_ns3_ecn
from emulator.reference.incast import INC
from emulator.reference.incast import nvidia
from emulator.reference.incast import off
from emulator.reference.incast import paper
from emulator.reference.incast import RateController
from emulator.reference.incast import Scenario
from emulator.reference.incast import simulate

FRAME = 4170
G100 = 100e9


def _frame_time(bps: float) -> float:
    return FRAME * 8 / bps


def _mean_depth(r, start: float, end: float) -> float:
    """Time-weighted mean queue depth over [start, end), from the change series."""
    times, depths = r.queue_times, r.queue_depths
    acc, t, d = 0.0, start, r.depth_at(start)
    for tt, dd in zip(times, depths):
        if tt <= start:
            continue
        if tt >= end:
            break
        acc += d * (tt - t)
        t, d = tt, dd
    acc += d * (end - t)
    return acc / (end - start)


class FakeTimers:
    """Collects the controller's timer requests; the latest per kind is the live one."""

    def __init__(self) -> None:
        self.live: dict[int, float] = {}

    def __call__(self, kind: int, when: float) -> None:
        self.live[kind] = when


# ----------------------------------------------------------------- queue and ECN


def test_single_flow_below_bottleneck_never_queues():
    # 10 Gb/s into a 40 Gb/s port: each frame is served (0.83 us) long before the next
    # arrives (3.3 us), so every arrival finds an empty queue.
    sc = Scenario(senders=1, line_rate_bps=10e9, bottleneck_bps=40e9, duration_s=300e-6,
                  kmin_bytes=0, kmax_bytes=10**9, pmax=1.0, dcqcn=off(10e9))
    r = simulate(sc)
    assert set(r.arrivals_by_depth) == {0}
    # An idle port serves a frame at once: it never queues (the shaper releases it and waits
    # out its time), as the emulator's enqueued - dequeued bytes count it.
    assert max(r.queue_depths) == 0
    assert r.marks == 0 and r.drops == 0
    start, end = 50e-6, 250e-6
    assert r.queue_percentiles([70, 100], start, end, sampled=False) == [0.0, 0.0]
    one_frame = _frame_time(40e9) / (end - start)  # a frame straddling a window edge
    assert r.utilisation(start, end) == pytest.approx(0.25, abs=one_frame + 1e-9)


def _windowed(window: int, buffer_frames: int = 10_000, **kw) -> Scenario:
    return Scenario(senders=4, line_rate_bps=G100, bottleneck_bps=G100, duration_s=1.5e-3,
                    base_rtt_s=10e-6, window_packets=window, ack_every=1,
                    buffer_bytes=buffer_frames * FRAME, kmin_bytes=10**9, kmax_bytes=2 * 10**9,
                    dcqcn=off(G100), **kw)


def test_window_holds_standing_queue_of_inflight_minus_bdp():
    # Little's law on the loop: N*W frames circulate; outside the bottleneck queue
    # each spends base_rtt + its serialisation at line rate; the rest of the loop is
    # the bottleneck, served one frame per frame time: the frame in service and the
    # queue behind it (the emulator's depth does not count the one in service).
    n, w = 4, 16
    r = simulate(_windowed(w))
    pipe_frames = (10e-6 + _frame_time(G100)) / _frame_time(G100)
    expected = (n * w - pipe_frames - 1) * FRAME  # 32.0 frames
    mean = _mean_depth(r, 0.5e-3, 1.5e-3)
    assert abs(mean - expected) < 1.5 * FRAME, (mean / FRAME, expected / FRAME)
    assert r.drops == 0
    assert r.utilisation(0.5e-3, 1.5e-3) == pytest.approx(1.0, abs=0.01)
    assert r.jain(0.5e-3, 1.5e-3) == pytest.approx(1.0, abs=1e-3)


def test_window_beyond_buffer_drops_at_the_buffer():
    r = simulate(_windowed(16, buffer_frames=20))
    assert r.drops > 0
    assert max(r.queue_depths) <= 20 * FRAME
    assert r.retransmits > 0


def test_ecn_curve_function():
    assert ecn_probability(5_000, 5_000, 200_000, 0.01) == 0.0  # at kmin: never
    assert ecn_probability(200_000, 5_000, 200_000, 0.01) == 1.0  # at kmax: always
    assert ecn_probability(102_500, 5_000, 200_000, 0.01) == pytest.approx(0.005)
    assert ecn_probability(0, 0, 0, 0.5) == 1.0  # kmin == kmax: a step at K


@pytest.mark.parametrize("kmin_f,kmax_f,pmax", [(29, 35, 0.5), (31, 41, 0.8), (24, 34, 0.2)])
def test_marking_follows_the_curve_statistically(kmin_f, kmax_f, pmax):
    # The window holds the depth found by arrivals at 32 frames (see above: 33 in the
    # queue with the one in service), after a start-up ramp through every smaller depth;
    # each threshold pair puts 32 frames at a different point of the ramp
    # (p = 0.25, 0.08, 0.16).
    kmin, kmax = kmin_f * FRAME, kmax_f * FRAME
    r = simulate(replace(_windowed(16), kmin_bytes=kmin, kmax_bytes=kmax, pmax=pmax,
                         duration_s=3e-3, seed=kmin_f))
    expected = var = 0.0
    on_ramp = 0
    for depth, n in r.arrivals_by_depth.items():
        p = ecn_probability(depth, kmin, kmax, pmax)
        m = r.marks_by_depth.get(depth, 0)
        if p == 0.0:
            assert m == 0, depth  # at or below kmin: never
        elif p == 1.0:
            assert m == n, depth  # at or above kmax: always
        else:
            on_ramp += n
        expected += n * p
        var += n * p * (1 - p)
    assert on_ramp > 5_000  # the test must actually exercise the ramp
    # Marks are a sum of independent Bernoulli(p(depth found)): 4 standard deviations.
    assert abs(r.marks - expected) < 4 * math.sqrt(var), (r.marks, expected, math.sqrt(var))


# ------------------------------------------------------------------ reaction point


def test_paper_first_cnp_cuts_by_initial_alpha_over_two_then_updates_alpha():
    for a0 in (1.0, 0.5):
        cfg = replace(paper(G100), initial_alpha=a0)
        timers = FakeTimers()
        rp = RateController(cfg, G100, timers)
        assert rp.on_cnp(0.0)
        assert rp.rc == pytest.approx(G100 * (1 - a0 / 2))
        assert rp.rt == G100
        assert rp.alpha == pytest.approx((1 - cfg.g) * a0 + cfg.g)
        assert timers.live[ALPHA] == pytest.approx(cfg.alpha_period_s)
        assert timers.live[INC] == pytest.approx(cfg.timer_s)


def test_flag_variants_cut_at_the_next_decrease_tick_with_initial_alpha():
    for cfg in (nvidia(G100), hpcc_ns3(G100)):
        timers = FakeTimers()
        rp = RateController(cfg, G100, timers)
        assert not rp.on_cnp(0.0)  # flags only
        assert rp.rc == G100
        assert rp.alpha == cfg.initial_alpha
        assert timers.live[DEC] >= cfg.rate_decrease_period_s
        assert rp.on_decrease(timers.live[DEC])
        # The first CNP set no alpha flag: the four 1 us ticks before the 4 us check decayed it.
        a = cfg.initial_alpha * (1 - cfg.g) ** 4
        assert rp.alpha == pytest.approx(a)
        assert rp.rc == pytest.approx(G100 * (1 - a / 2))


def test_paper_alpha_moves_on_every_cnp_mlx_once_per_period():
    # Paper: two CNPs, two alpha updates (and two cuts).
    cfg = replace(paper(G100), initial_alpha=0.5)
    rp = RateController(cfg, G100, FakeTimers())
    rp.on_cnp(0.0)
    rp.on_cnp(0.1e-6)
    g = cfg.g
    assert rp.alpha == pytest.approx((1 - g) * ((1 - g) * 0.5 + g) + g)
    assert rp.cuts == 2
    # ns-3 mlx: after the first CNP, any number of CNPs in one alpha period raise
    # alpha once, and the rate is cut once per decrease period.
    cfg = hpcc_ns3(G100)
    timers = FakeTimers()
    rp = RateController(cfg, G100, timers)
    rp.on_cnp(0.0)
    for k in range(5):  # the tick at 1 us saw no CNP (1 -> 1-g); these five fall before 2 us
        rp.on_cnp(1.2e-6 + k * 0.1e-6)
    rp._catch_up_alpha(2e-6)  # the tick at 2 us counts them once
    g = cfg.g
    assert rp.alpha == pytest.approx((1 - g) * (1 - g) + g)
    assert rp.cuts == 0
    rp.on_decrease(timers.live[DEC])
    assert rp.cuts == 1


def test_ns3_timer_increase_is_fast_recovery_then_additive_then_hyper():
    cfg = hpcc_ns3(G100)  # F = 1, no byte counter; R_AI 20 Mb/s, R_HAI 200 Mb/s at 100G
    assert (cfg.rate_ai_bps, cfg.rate_hai_bps) == (20e6, 200e6)
    timers = FakeTimers()
    rp = RateController(cfg, G100, timers)
    rp.on_cnp(0.0)
    rp.on_decrease(timers.live[DEC])  # alpha decayed by four ticks; rt = 100G (stage 0: no clamp)
    rc0 = G100 * (1 - (1 - cfg.g) ** 4 / 2)
    assert (rp.rc, rp.rt) == (pytest.approx(rc0), G100)
    rp.rt = 80e9  # a lower target, so the increase steps are visible
    rp.on_timer(timers.live[INC])  # stage 0 < F: fast recovery
    rc1 = (rc0 + 80e9) / 2
    assert (rp.rc, rp.rt) == (pytest.approx(rc1), 80e9)
    rp.on_timer(timers.live[INC])  # stage 1 == F: additive
    assert rp.rt == 80e9 + 20e6 and rp.rc == pytest.approx((rc1 + rp.rt) / 2)
    rc = rp.rc
    rp.on_timer(timers.live[INC])  # stage 2 > F: hyper
    assert rp.rt == 80e9 + 20e6 + 200e6 and rp.rc == pytest.approx((rc + rp.rt) / 2)


def test_nvidia_byte_counter_drives_increases_and_clamps_target():
    cfg = nvidia(G100)
    timers = FakeTimers()
    rp = RateController(cfg, G100, timers)
    rp.on_cnp(0.0)
    rp.on_decrease(timers.live[DEC])
    rc0 = rp.rc
    assert not rp.on_bytes(cfg.byte_counter - 1)
    assert rp.on_bytes(1)  # first byte event: fast recovery toward Rt = line
    assert rp.rc == pytest.approx((rc0 + G100) / 2)
    assert rp.b_stage == 1
    rc1 = rp.rc
    rp.on_cnp(1e-6)  # a cut after a byte-counter increase clamps Rt to Rc
    rp.on_decrease(timers.live[DEC])
    assert rp.rt == rc1
    assert rp.rc == pytest.approx(max(rc1 * (1 - rp.alpha / 2), 0.5 * rc1))


# --------------------------------------------------------------- whole-loop rules


def _all_marked(cfg: Dcqcn, duration: float = 200e-6, senders: int = 1) -> Scenario:
    # kmin = kmax = 0: every admitted frame is marked, whatever the queue.
    return Scenario(senders=senders, line_rate_bps=G100, bottleneck_bps=G100,
                    duration_s=duration, base_rtt_s=4e-6, cnp_delay_s=4e-6,
                    reaction_delay_s=1e-6, kmin_bytes=0, kmax_bytes=0, pmax=1.0, dcqcn=cfg)


def test_first_cut_lands_one_feedback_loop_after_the_first_frame():
    r = simulate(_all_marked(paper(G100)))
    ser = _frame_time(G100)
    # sender serialisation + rtt/4, bottleneck serialisation, rtt/4 to the receiver,
    # CNP delay, rtt/2 back, reaction delay.
    t_cut = ser + 1e-6 + ser + 1e-6 + 4e-6 + 2e-6 + 1e-6
    t, rc = r.rate_series(0)[1]
    assert t == pytest.approx(t_cut, abs=1e-12)
    assert rc == pytest.approx(G100 / 2)


def test_np_rules_per_variant():
    dur = 200e-6
    # ns-3 answers every marked frame.
    r = simulate(_all_marked(hpcc_ns3(G100), dur))
    assert r.cnps_sent == r.marks > 20
    # Paper: one CNP per flow per N = 50 us; NVIDIA: one per 4 us.
    for cfg in (paper(G100), nvidia(G100)):
        r = simulate(_all_marked(cfg, dur, senders=2))
        gaps = cfg.cnp_interval_s
        # At most ceil(run / N) CNPs per sender, and one more the paper defers past the end.
        assert 0 < r.cnps_sent <= 2 * (math.ceil(dur / gaps) + (1 if cfg.cnp_defer else 0))
        assert r.cnps_sent < r.marks
        times = list(r.cnp_times)
        # With two flows, two of any three consecutive CNPs are for the same flow, so
        # the three span at least one interval.
        assert all(b - a >= gaps - 1e-12 for a, b in zip(times, times[2:]))


def test_ns3_cuts_at_most_once_per_decrease_interval_on_its_grid():
    # A high floor keeps the flow fast, so several marked frames (and CNPs) fall in
    # every 4 us period; each period with a CNP is one cut (recorded even at the floor).
    cfg = replace(hpcc_ns3(G100), min_rate_bps=50e9)
    r = simulate(_all_marked(cfg, 300e-6))
    cut_times = [t for t, _ in r.rate_series(0)[1:]]
    assert len(cut_times) == r.cuts[0] >= 50  # no increases: the timer never expires
    assert r.cnps_received > 3 * len(cut_times)  # many CNPs, one cut per period
    first = cut_times[0]
    for t in cut_times:
        k = (t - first) / cfg.rate_decrease_period_s
        assert abs(k - round(k)) < 1e-6  # on the 4 us grid
    gaps = [b - a for a, b in zip(cut_times, cut_times[1:])]
    assert min(gaps) >= cfg.rate_decrease_period_s - 1e-12


def test_the_paper_defers_a_cnp_for_marks_inside_n_and_nvidia_drops_them():
    dur = 200e-6
    for cfg, deferred in ((paper(G100), True), (nvidia(G100), False)):
        r = simulate(_all_marked(cfg, dur, senders=1))
        times = list(r.cnp_times)
        gaps = [b - a for a, b in zip(times, times[1:])]
        # Every frame is marked: with deferral the CNPs come exactly N apart, one per window;
        # NVIDIA's moderation sends the first mark after N, which comes later than N.
        if deferred:
            assert gaps and all(abs(g - cfg.cnp_interval_s) < 1e-12 for g in gaps)
        else:
            assert gaps and all(g >= cfg.cnp_interval_s - 1e-12 for g in gaps)


def test_paper_cuts_on_every_cnp():
    r = simulate(_all_marked(paper(G100), 300e-6))
    assert r.cuts[0] == r.cnps_received > 1


# ------------------------------------------------------------ conservation, seeds


@pytest.mark.parametrize("window,ack_every", [(0, 1), (12, 4)])
def test_bytes_are_conserved_through_drops_and_retransmissions(window, ack_every):
    frames = 300
    sc = Scenario(senders=4, line_rate_bps=G100, bottleneck_bps=G100,
                  bytes_per_sender=frames * FRAME, base_rtt_s=4e-6, buffer_bytes=8 * FRAME,
                  window_packets=window, ack_every=ack_every, kmin_bytes=0,
                  kmax_bytes=4 * FRAME, pmax=0.2, dcqcn=off(G100), rto_s=50e-6,
                  send_jitter_s=20e-9)
    r = simulate(sc)
    assert r.drops > 0
    assert all(f is not None for f in r.finish_s)
    delivered = [b // FRAME for b in r.delivered_bytes]
    assert delivered == [frames] * 4
    assert r.sent_packets == [frames] * 4
    assert sum(delivered) == sum(r.sent_packets) - r.drops + r.retransmits
    assert r.retransmits == r.drops  # every loss is repaired exactly once


def test_deterministic_for_a_seed():
    sc = _all_marked(nvidia(G100), 200e-6, senders=3)
    sc = replace(sc, kmin_bytes=2 * FRAME, kmax_bytes=40 * FRAME, pmax=0.3)
    a, b = simulate(sc), simulate(sc)
    assert list(a.queue_depths) == list(b.queue_depths)
    assert list(a.queue_times) == list(b.queue_times)
    assert (a.marks, a.cnps_sent) == (b.marks, b.cnps_sent)
    assert [list(x) for x in a.rate_bps] == [list(x) for x in b.rate_bps]
    c = simulate(replace(sc, seed=sc.seed + 1))
    assert (c.marks, list(c.queue_depths)) != (a.marks, list(a.queue_depths))


# ------------------------------------------------------------------ defaults, API


def test_source_defaults_and_scaling():
    assert nvidia(400e9).g == pytest.approx(5 / 1024)
    assert nvidia(400e9).byte_counter == 32767
    ns3 = hpcc_ns3(400e9)
    assert (ns3.rate_ai_bps, ns3.rate_hai_bps) == (80e6, 800e6)  # 5*bw/25, 50*bw/25 Mb/s
    assert hpcc_ns3_ecn(400e9) == (1_600_000, 6_400_000, 0.2)
    assert paper(400e9) == paper(40e9)  # 40G-era values, not scaled
    assert replace(paper(400e9), cnp_interval_s=0.0).cnp_interval_s == 0.0
    with pytest.raises(ValueError):
        Dcqcn(variant="bogus")
    with pytest.raises(ValueError):
        Scenario()  # neither bytes nor duration


def test_second_half_summary():
    r = simulate(replace(_windowed(16), duration_s=1e-3))
    h = r.second_half()
    assert h["start_s"] == pytest.approx(0.5e-3) and h["end_s"] == pytest.approx(1e-3)
    assert h["utilisation"] == pytest.approx(1.0, abs=0.01)
    qs = [h[k] for k in ("queue_p50_bytes", "queue_p90_bytes", "queue_p99_bytes",
                         "queue_max_bytes")]
    assert qs == sorted(qs)
    assert h["drops"] == 0 and h["cnps"] == 0
    series = r.throughput_series(0, 100e-6)
    busy = [bps for t, bps in series if 0.5e-3 <= t < 0.9e-3]
    assert all(b == pytest.approx(25e9, rel=0.05) for b in busy)
