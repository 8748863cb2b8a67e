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
    rp.on_cnp(0.0)  # alpha starts at 1: half the rate
    assert (rp.rt, rp.rc, rp.alpha) == (L, L / 2, pytest.approx((1 - G) * 1 + G))
    rp.on_cnp(10 * US)  # nothing due yet at 10 us; a second cut
    assert (rp.rt, rp.rc) == (L / 2, L / 4)
    # 65 us: alpha decays (first), then the timer's first stage: fast recovery halves the gap.
    rp.advance(65 * US)
    assert rp.alpha == pytest.approx(1 - G)
    assert (rp.i, rp.rc) == (1, pytest.approx((20e9 + 10e9) / 2))
    rc = 15e9
    for stage, t in ((2, 120), (3, 175), (4, 230)):
        rp.advance(t * US)
        rc = (20e9 + rc) / 2
        assert (rp.i, rp.rc) == (stage, pytest.approx(rc))
    assert rp.alpha == pytest.approx((1 - G) ** 4)
    # Fifth stage: max(i, j) = F = 5, min(i, j) = 0 < F: additive increase of the target.
    rp.advance(285 * US)
    rt = 20e9 + 40 * MBPS
    rc = (rt + rc) / 2
    assert (rp.i, rp.rt, rp.rc) == (5, pytest.approx(rt), pytest.approx(rc))
    # The byte counter: each 10 MB sent is a stage j; still additive until j reaches F.
    for j in range(1, 5):
        rp.on_sent(10_000_000, 286 * US)
        rt += 40 * MBPS
        rc = (rt + rc) / 2
        assert (rp.j, rp.rt, rp.rc) == (j, pytest.approx(rt), pytest.approx(rc))
    rp.on_sent(10_000_000, 287 * US)  # min(i, j) = 5 >= F: hyper increase
    rt += 400 * MBPS
    rc = (rt + rc) / 2
    assert (rp.j, rp.rt, rp.rc) == (5, pytest.approx(rt), pytest.approx(rc))


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
    rp = ReactionPoint(p, L * 0.001)
    rp.on_cnp(0.0)
    rp.on_cnp(0.0)  # a second cut: the target is below the line, so the increase shows
    rc, rt = rp.rc, rp.rt
    rp.on_sent(4142, 1 * US)
    assert rp.j == 1 and rp.bytes == 4142 % 33
    # F = 1 and i = 0: one additive increase, then Rc halfway to the target.
    assert rp.rt == pytest.approx(rt + 5 * MBPS * 0.001)
    assert rp.rc == pytest.approx((rp.rt + rc) / 2)


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
    p = profile("nvidia", L)
    assert (p.g, p.timer_s, p.byte_counter, p.rate_ai_bps, p.rate_hai_bps, p.min_rate_bps, p.fast_recovery) == (
        5 / 1024, 300 * US, 32767, 5 * MBPS, 50 * MBPS, 1 * MBPS, 1)
    rp = ReactionPoint(p, L)
    rp.on_cnp(0.0)
    assert rp.rc == L / 2 and rp.alpha == pytest.approx(1.0)
    rp.advance(299.5 * US)
    assert rp.alpha == pytest.approx((1 - 5 / 1024) ** 299)  # one decay per microsecond
    rp.advance(300 * US)  # F = 1: the first timer stage is already additive
    assert rp.i == 1 and rp.rt == L and rp.rc == pytest.approx((L + L / 2) / 2)
    rp.on_sent(32767, 301 * US)  # min(i, j) = 1 >= F: hyper; the target is capped at the line
    assert rp.j == 1 and rp.rt == L and rp.rc == pytest.approx((L + (L + L / 2) / 2) / 2)


def test_hpcc_ns3_is_timer_only_and_scales_with_the_line():
    p = profile("hpcc-ns3", 400 * GBPS)
    assert p.byte_counter == 0 and p.timer_s == 300 * US and p.fast_recovery == 1
    assert (p.rate_ai_bps, p.rate_hai_bps, p.kmin, p.kmax, p.pmax) == (
        pytest.approx(80 * MBPS), pytest.approx(800 * MBPS), 1_600_000, 6_400_000, 0.2)
    rp = ReactionPoint(p, 400 * GBPS)
    rp.on_cnp(0.0)
    rp.on_sent(10 ** 9, 1 * US)
    assert rp.j == 0  # no byte counter
    rp.advance(300 * US)
    assert rp.i == 1 and rp.rt == 400 * GBPS  # additive from the first stage, capped at the line


def test_off_never_changes_the_rate_and_sends_no_cnp():
    p = profile("off", L)
    rp = ReactionPoint(p, L)
    rp.on_cnp(0.0)
    rp.on_sent(10 ** 9, 1.0)
    assert rp.rate_bps == L and rp.cnps == 0
    assert NotificationPoint(p).on_ce(0.0) is False


def test_the_notification_point_sends_at_most_one_cnp_per_interval():
    np_ = NotificationPoint(profile("paper", L))  # N = 50 us
    got = [np_.on_ce(t * US) for t in (0, 20, 49, 50, 51, 120)]
    assert got == [True, False, False, True, False, True]
    assert (np_.cnps, np_.ce_packets) == (3, 6)


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

    rp = ReactionPoint(profile("paper", 8 * MBPS), 8 * MBPS)  # 1 MB/s
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
