"""The delay tier: the 3,000 km are real. Needs sch_netem; skipped with the reason without it."""
from __future__ import annotations

import pytest

from emulator import capabilities

from .conftest import bp_json

pytestmark = pytest.mark.netem
if not capabilities.has_netem():
    pytest.skip("this kernel has no sch_netem: the delay tier runs in a VM with a stock kernel",
                allow_module_level=True)


def test_cross_dc_rtt_is_the_fibers_and_intra_dc_is_short(fabrics):
    name = fabrics("tdelay", "cross-dc")
    body = bp_json("status", "--name", name)
    rtt = {r["scope"]: r for r in body["rtt"]}
    assert body["wan_delay"] and not body["warnings"]
    assert 0.030 <= rtt["cross-dc"]["avg_s"] <= 0.030 * 1.05, rtt["cross-dc"]
    assert rtt["intra-dc"]["avg_s"] < 0.002, rtt["intra-dc"]
