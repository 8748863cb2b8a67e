"""Two readings of DCQCN's sources, written apart, must agree on every profile's values and rules:
the soft-NIC's profiles (emulator/nic/dcqcn.py) and the reference model's constructors
(emulator/reference/incast.py). A disagreement means one of them misreads its source."""
from __future__ import annotations

from dataclasses import asdict

import pytest

from emulator.nic import dcqcn
from emulator.reference import incast as ref
from emulator.telemetry import modelcheck

LINES = (40e9, 100e9, 400e9)
MODEL = {"paper": ref.paper, "nvidia": ref.nvidia, "hpcc-ns3": ref.hpcc_ns3}
FIELDS = ("g", "cnp_interval_s", "cnp_defer", "alpha_period_s", "timer_s", "byte_counter", "fast_recovery",
          "rate_ai_bps", "rate_hai_bps", "min_rate_bps", "rate_decrease_period_s", "min_dec_factor",
          "clamp_target_rate", "clamp_after_timer_increase", "initial_alpha", "hyper_step")


@pytest.mark.parametrize("line", LINES)
@pytest.mark.parametrize("name", sorted(MODEL))
def test_the_nics_profiles_and_the_models_read_the_same_sources(name, line):
    nic = modelcheck.model_dcqcn(asdict(dcqcn.profile(name, line)), line)
    model = MODEL[name](line)
    for f in FIELDS:
        got, want = getattr(nic, f), getattr(model, f)
        assert got == (pytest.approx(want) if isinstance(want, float) else want), f
    assert nic.variant == model.variant


def test_hpcc_ns3_switch_thresholds_agree():
    for line in LINES:
        p = dcqcn.profile("hpcc-ns3", line)
        assert (p.kmin, p.kmax, p.pmax) == ref.hpcc_ns3_ecn(line)
