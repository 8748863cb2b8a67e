"""DCQCN's reaction and notification points against traces computed by hand from the equations:
cut, alpha update and decay, fast recovery, additive and hyper increase, byte counter, minimum
rate, for each profile."""
from __future__ import annotations

import pytest

from emulator.nic.dcqcn import GBPS, MBPS, PROFILE_NAMES, NotificationPoint, ReactionPoint, profile

L = 40 * GBPS
US = 1e-6
G = 1 / 256


def test_paper_cut_then_fast_recovery_then_additive_then_hyper():
    rp = ReactionPoint(profile("paper", L), L)
    rp.on_cnp(0.0)  # alpha starts at 1: half the rate; the cut takes alpha from before its bump
    assert (rp.rt, rp.rc, rp.alpha) == (L, L / 2, pytest.approx((1 - G) * 1 + G))
    rp.on_cnp(10 * US)  # nothing due yet at 10 us; a second cut, at once (no decrease period)
    assert (rp.rt, rp.rc, rp.cuts) == (L / 2, L / 4, 2)
    # 65 us: alpha decays (first), then the timer's first event: fast recovery halves the gap.
    rp.advance(65 * US)
    assert rp.alpha == pytest.approx(1 - G)
    assert (rp.i, rp.rc) == (1, pytest.approx((20e9 + 10e9) / 2))
    rc = 15e9
    # F = 5 events of fast recovery in all (decided on the 0..4 events done before each).
    for stage, t in ((2, 120), (3, 175), (4, 230), (5, 285)):
        rp.advance(t * US)
        rc = (20e9 + rc) / 2
        assert (rp.i, rp.rt, rp.rc) == (stage, 20e9, pytest.approx(rc))
    assert rp.alpha == pytest.approx((1 - G) ** 5)
    # The byte counter: each 10 MB sent is an event; with i = 5 done and j < F, additive.
    rt = 20e9
    for j in range(1, 6):
        rp.on_sent(10_000_000, 286 * US)
        rt += 40 * MBPS
        rc = (rt + rc) / 2
        assert (rp.j, rp.rt, rp.rc) == (j, pytest.approx(rt), pytest.approx(rc))
    # min(i, j) = 5 >= F: hyper increase, R_HAI x (min(i, j) - F + 1) (the authors' simulator).
    rp.on_sent(10_000_000, 287 * US)
    rt += 200 * MBPS
    rc = (rt + rc) / 2
    assert (rp.j, rp.rt, rp.rc) == (6, pytest.approx(rt), pytest.approx(rc))
    rp.advance(340 * US)  # the timer: min(5 done, 6 done) = 5, one step; then i = 6
    rt += 200 * MBPS
    rc = (rt + rc) / 2
    assert (rp.i, rp.rt, rp.rc) == (6, pytest.approx(rt), pytest.approx(rc))
    rp.on_sent(10_000_000, 341 * US)  # min(6, 6) = 6: two steps
    rt += 2 * 200 * MBPS
    rc = (rt + rc) / 2
    assert (rp.j, rp.rt, rp.rc) == (7, pytest.approx(rt), pytest.approx(rc))


def test_bytes_count_across_calls_and_a_cnp_restarts_them():
    rp = ReactionPoint(profile("paper", L), L)
    rp.on_cnp(0.0)
    rp.on_sent(6_000_000, 1 * US)
    assert rp.j == 0
    rp.on_sent(6_000_000, 2 * US)
    assert (rp.j, rp.bytes) == (1, 2_000_000)
    rp.on_cnp(3 * US)
    assert (rp.i, rp.j, rp.bytes) == (0, 0, 0)


def test_a_packet_larger_than_the_byte_counter_is_one_stage():
    # NVIDIA's B of 32767 B at scale 0.001 is 33 B: a 4 KB frame is one stage, not 125.
    p = profile("nvidia", L).scaled(0.001)
    line = L * 0.001
    rp = ReactionPoint(p, line)
    rp.on_cnp(0.0)
    rp.advance(5 * US)  # the cut, at the first rate-decrease tick (4 us)
    assert rp.cuts == 1 and rp.rc < line
    rc, rt = rp.rc, rp.rt
    rp.on_sent(4142, 6 * US)
    assert rp.j == 1 and rp.bytes == 4142 % 33
    # The first event after the cut is fast recovery (none done before it), towards the
    # target, still the line.
    assert rp.rt == rt == line
    assert rp.rc == pytest.approx((line + rc) / 2)


def test_alpha_decays_only_without_cnps():
    rp = ReactionPoint(profile("paper", L), L)
    rp.on_cnp(0.0)
    rp.on_cnp(50 * US)  # before the first decay at 55 us: it restarts the period
    rp.advance(104 * US)
    assert rp.alpha == pytest.approx(1.0)
    rp.advance(105 * US)
    assert rp.alpha == pytest.approx(1 - G)
    rp.advance(105 * US + 3 * 55 * US)
    assert rp.alpha == pytest.approx((1 - G) ** 4)


def test_the_rate_never_falls_below_the_minimum_nor_rises_above_the_line():
    p = profile("paper", L)
    rp = ReactionPoint(p, L)
    for k in range(40):
        rp.on_cnp(k * US)
    assert rp.rc == p.min_rate_bps
    rp.advance(1.0)  # a long quiet second: back to the line, not beyond
    assert rp.rc == pytest.approx(L) and rp.rc <= L and rp.rt <= L


def test_nvidia_trace():
    """ConnectX: alpha updated every 1 us from a "CNP seen" flag, at most one cut per 4 us at the
    period's tick, never below half the rate, the target clamped only after an increase."""
    p = profile("nvidia", L)
    g = 5 / 1024
    assert (p.g, p.timer_s, p.byte_counter, p.rate_ai_bps, p.rate_hai_bps, p.min_rate_bps, p.fast_recovery,
            p.cnp_interval_s, p.alpha_period_s, p.rate_decrease_period_s, p.min_dec_factor) == (
        g, 300 * US, 32767, 5 * MBPS, 50 * MBPS, 1 * MBPS, 1, 4 * US, 1 * US, 4 * US, 0.5)
    rp = ReactionPoint(p, L)
    rp.on_cnp(0.0)  # the first CNP sets alpha to 1023/1024; nothing is cut before the tick
    assert rp.alpha == 1023 / 1024 and rp.rc == L
    rp.advance(3.9 * US)
    assert rp.rc == L and rp.alpha == pytest.approx(1023 / 1024 * (1 - g) ** 3)
    rp.advance(4.1 * US)  # the tick at 4 us: alpha after four quiet ticks (the first CNP sets no flag)
    a = 1023 / 1024 * (1 - g) ** 4
    assert rp.cuts == 1 and rp.rc == pytest.approx(L * (1 - a / 2)) and rp.rt == L
    rc = rp.rc
    # Three CNPs within one period: one cut, at the 8 us tick, with alpha bumped at the ticks
    # after each of them and decayed at the quiet one.
    for t in (4.5, 5.5, 6.5):
        rp.on_cnp(t * US)
    rp.advance(8.1 * US)
    a = a * (1 - g) + g  # tick 5: the CNP at 4.5
    a = a * (1 - g) + g  # tick 6: the CNP at 5.5
    a = a * (1 - g) + g  # tick 7: the CNP at 6.5
    a = a * (1 - g)  # tick 8: quiet
    assert rp.cuts == 2 and rp.alpha == pytest.approx(a)
    # No increase since the first cut: the target stays at the line (clamp_tgt_rate 0).
    assert rp.rt == L and rp.rc == pytest.approx(rc * (1 - a / 2))
    rc = rp.rc
    rp.advance(308.1 * US)  # the timer, 300 us after the cut: fast recovery towards the line
    assert rp.i == 1 and rp.rt == L and rp.rc == pytest.approx((L + rc) / 2)
    rc = rp.rc
    rp.on_cnp(309 * US)  # after an increase: the cut clamps the target to the rate
    rp.advance(313 * US)
    assert rp.cuts == 3 and rp.rt == pytest.approx(rc)


def test_the_nvidia_decrease_never_takes_more_than_its_floor():
    rp = ReactionPoint(profile("nvidia", L, {"min_dec_factor": 0.9}), L)
    rp.on_cnp(0.0)
    rp.advance(5 * US)
    assert rp.rc == pytest.approx(0.9 * L)  # alpha ~1 would halve it; the floor holds it at 90%


def test_hpcc_ns3_first_cnp_defers_the_cut_and_stages_go_fast_additive_hyper():
    """rdma-hw.cc (CcMode 1): the first CNP sets alpha to 1 and cuts nothing; cuts come at most
    once per 4 us on a grid from it; the timer stage is checked before it counts: with F = 1
    fast recovery, then additive, then hyper; the target is clamped only after an increase."""
    line = 400 * GBPS
    p = profile("hpcc-ns3", line)
    g = 1 / 256
    assert p.byte_counter == 0 and p.timer_s == 300 * US and p.fast_recovery == 1 and p.cnp_interval_s == 0
    assert (p.rate_ai_bps, p.rate_hai_bps, p.kmin, p.kmax, p.pmax) == (
        pytest.approx(80 * MBPS), pytest.approx(800 * MBPS), 1_600_000, 6_400_000, 0.2)
    rp = ReactionPoint(p, line)
    rp.on_cnp(0.0)
    assert rp.rc == line and rp.alpha == 1.0
    rp.advance(4.1 * US)
    a = (1 - g) ** 4
    assert rp.cuts == 1 and rp.rc == pytest.approx(line * (1 - a / 2)) and rp.rt == line
    rc = rp.rc
    rp.on_sent(10 ** 9, 5 * US)
    assert rp.j == 0  # no byte counter
    rp.advance(304.1 * US)  # stage 0 < F: fast recovery
    rc = (line + rc) / 2
    assert (rp.i, rp.rc, rp.rt) == (1, pytest.approx(rc), line)
    rp.on_cnp(305 * US)  # after an increase: the next tick (308 us) clamps Rt to Rc, then cuts
    rp.advance(308.1 * US)
    assert rp.cuts == 2 and rp.rt == pytest.approx(rc) and rp.i == 0
    rt, rc = rp.rt, rp.rc
    rp.advance(608.1 * US)  # stage 0: fast recovery
    rc = (rt + rc) / 2
    assert rp.rc == pytest.approx(rc) and rp.rt == pytest.approx(rt)
    rp.advance(908.1 * US)  # stage 1 = F: additive
    rt += 80 * MBPS
    rc = (rt + rc) / 2
    assert rp.rt == pytest.approx(rt) and rp.rc == pytest.approx(rc)
    rp.advance(1208.1 * US)  # stage 2 > F: hyper, a constant step
    rt += 800 * MBPS
    rc = (rt + rc) / 2
    assert (rp.i, rp.rt, rp.rc) == (3, pytest.approx(rt), pytest.approx(rc))


def test_off_never_changes_the_rate_and_sends_no_cnp():
    p = profile("off", L)
    rp = ReactionPoint(p, L)
    rp.on_cnp(0.0)
    rp.on_sent(10 ** 9, 1.0)
    assert rp.rate_bps == L and rp.cnps == 0
    assert NotificationPoint(p).on_ce(0.0) is None


def test_the_papers_notification_point_defers_marks_inside_n():
    """At most one CNP per N; a mark inside N gets one CNP when N has passed, which covers the
    marks until then (the paper; htsim defers, the authors' simulator polls every N)."""
    np_ = NotificationPoint(profile("paper", L))  # N = 50 us
    got = [np_.on_ce(t * US) for t in (0, 20, 49, 120, 130, 140)]
    want = [0, 50 * US, None, 120 * US, 170 * US, None]
    assert got == [pytest.approx(w) if w is not None else None for w in want]
    assert (np_.cnps, np_.ce_packets) == (4, 6)


def test_nvidia_drops_marks_inside_n_and_hpcc_answers_every_mark():
    nv = NotificationPoint(profile("nvidia", L))  # N = 4 us, moderated, not deferred
    assert [nv.on_ce(t * US) for t in (0, 2, 4, 5)] == [0, None, pytest.approx(4 * US), None]
    hp = NotificationPoint(profile("hpcc-ns3", L))  # a CNP flag on the ACK of every marked packet
    assert [hp.on_ce(t * US) for t in (0, 0.1, 0.2)] == [0, pytest.approx(0.1 * US), pytest.approx(0.2 * US)]


def test_profiles_scale_and_take_overrides_field_by_field():
    p = profile("paper", L, {"g": 1 / 16, "rate_ai_bps": 10 * MBPS}).scaled(0.001)
    assert p.g == 1 / 16 and p.rate_ai_bps == pytest.approx(10_000)
    assert p.byte_counter == 10_000 and p.kmin == 5 and p.kmax == 200 and p.timer_s == pytest.approx(55 * US)
    with pytest.raises(ValueError, match="no field bogus"):
        profile("paper", L, {"bogus": 1})
    with pytest.raises(ValueError, match="use one of"):
        profile("fast", L)
    assert set(PROFILE_NAMES) == {"paper", "nvidia", "hpcc-ns3", "off"}


def test_the_pacer_holds_a_qp_to_its_current_rate():
    from emulator.nic.dcqcn import RatePacer

    rp = ReactionPoint(profile("paper", 8 * MBPS, {"min_rate_bps": 1 * MBPS}), 8 * MBPS)  # 1 MB/s
    pacer = RatePacer(rp, burst=10_000, overhead=0)
    assert pacer(0.0, 6_000) and pacer(0.0, 6_000)  # the burst, and one packet into debt
    assert not pacer(0.0, 6_000)
    assert pacer.wait(0.0) == pytest.approx(2_000 / 1e6)
    assert not pacer(0.0019, 6_000) and pacer(0.002, 6_000)
    rp.on_cnp(0.002)  # half the rate: the debt takes twice as long to pay
    assert pacer.wait(0.002) == pytest.approx(6_000 / 0.5e6)


def test_the_rate_integral_follows_every_cut_and_increase():
    """allowed_bits is the area under Rc: telemetry's mean rate between two readings."""
    rp = ReactionPoint(profile("paper", L), L)
    assert rp.allowed_bits(10 * US) == pytest.approx(L * 10 * US)  # at line rate until a CNP
    rp.on_cnp(10 * US)  # Rc = L/2 from 10 us
    # 65 us: the first timer stage at 65 us lifts Rc to 3L/4 (fast recovery towards Rt = L)
    area = L * 10 * US + L / 2 * 55 * US + 0.75 * L * 5 * US
    assert rp.allowed_bits(70 * US) == pytest.approx(area)
    off = ReactionPoint(profile("off", L), L)
    off.on_cnp(1 * US)
    assert off.allowed_bits(100 * US) == pytest.approx(L * 100 * US)


@pytest.mark.parametrize("name", ["paper", "nvidia", "hpcc-ns3"])
def test_cnps_cut_what_a_qp_puts_on_the_wire(name):
    """What matters is the bytes that leave, not the variable Rc: a QP with a long WRITE posted,
    driven on a fake clock for 2 ms with a CNP as often as the profile's notification point may
    send one (N; 4 us when it answers every marked packet), sends at most what its rate's
    integral allows (plus the pacer's burst) and much less than the line would carry; without
    CNPs the same QP sends at the line rate. Pacing switched off, or a reaction point that does
    nothing, fails this."""
    from emulator.nic.dcqcn import RatePacer
    from emulator.nic.memory import ProtectionDomain
    from emulator.nic.rc import CompletionQueue, QpConfig, QueuePair

    line, step, span = 40 * GBPS, 1 * US, 2e-3

    def run(cnp_every: float | None) -> tuple[int, ReactionPoint, RatePacer]:
        qp = QueuePair(0x100, ProtectionDomain(), CompletionQueue(), CompletionQueue(),
                       QpConfig(max_inflight=1 << 20, rx_window=1 << 22))
        qp.connect(0x200, 0)
        qp.rp = rp = ReactionPoint(profile(name, line), line)
        qp.pace = pacer = RatePacer(rp, burst=2 * 4196)
        qp.post_write(1, bytes(64 << 20), 0, 0)
        sent, next_cnp = 0, cnp_every
        for k in range(int(span / step)):
            now = k * step
            if next_cnp is not None and now >= next_cnp:
                rp.on_cnp(now)
                next_cnp += cnp_every
            for hdr, payload, pad in qp.transmit(now, 64):
                sent += len(hdr) + len(payload) + len(pad) + 4 + 42  # as the pacer counts it
        return sent, rp, pacer

    free, _, _ = run(None)
    assert free >= 0.95 * line / 8 * span  # nothing held it back
    sent, rp, pacer = run(max(profile(name, line).cnp_interval_s, 4 * US))
    allowed = rp.allowed_bits(span) / 8
    assert sent <= allowed + pacer.burst + 4196 + 46, (sent, allowed)
    assert sent <= 0.7 * free, (sent, free)
