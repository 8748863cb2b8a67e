"""The scenario file (emulator/model/scenario.py): valid ones parse, every error names its key path."""
from __future__ import annotations

from pathlib import Path

import pytest

from emulator.errors import SpecError
from emulator.model import plan as plan_mod, scenario, spec

REPO = Path(__file__).resolve().parents[2]

GOOD = """
version: 1
topology: ../topologies/cross-dc.yaml
workload:
  transfer: {src: east-host0, dst: west-host0, size: 64MB, qps: 16}
events:
  - {at: 90ms, event: restore, target: all}
  - {at: 10ms, event: ber, target: wan3, ber: 1e-6}
  - {at: 40ms, event: fiber-cut, target: wan3}
  - {at: 50ms, event: link-flap, target: east-border0:eth0, count: 3, period: 2ms}
  - {at: 60ms, event: rate, target: wan1, rate: 100Gbps}
  - {at: 70ms, event: latency-step, target: wan2, extra: 200km}
  - {at: 80ms, event: switch-failure, target: east-spine1}
"""


def parse(text: str) -> scenario.Scenario:
    return scenario.parse(text, "scenarios/s.yaml")


def test_a_scenario_parses_in_time_order_with_its_units():
    s = parse(GOOD)
    assert [e.kind for e in s.events] == ["ber", "fiber-cut", "link-flap", "rate", "latency-step", "switch-failure",
                                          "restore"]
    assert s.events[0].at_s == pytest.approx(0.010) and s.events[0].options == {"ber": 1e-6}
    assert s.events[2].options == {"count": 3, "period": pytest.approx(0.002)}
    assert s.events[3].options == {"rate": 100_000_000_000}
    assert s.events[4].options == {"extra": pytest.approx(200_000)}
    assert s.detection_s == scenario.DEFAULT_DETECTION_S and s.name == "s" and s.workload.qps == 16
    assert str(s.topology_path()) == "scenarios/../topologies/cross-dc.yaml"


@pytest.mark.parametrize("change, where, says", [
    (("ber: 1e-6", "ber: 2"), "events[1].ber", "probability"),
    (("ber: 1e-6", "ber: 1e-6, rate: 1Gbps"), "events[1].rate", "ber takes no rate"),
    (("event: fiber-cut", "event: fibre-cut"), "events[2].event", "fiber-cut"),
    (("count: 3, period: 2ms", "count: 3"), "events[3].period", "is required"),
    (("rate: 100Gbps", "rate: fast"), "events[4].rate", "rate"),
    (("at: 40ms", "at: -1ms"), "events[2].at", ""),
    (("target: wan3}", "target: all}"), "events[2].target", "only restore"),
    (("size: 64MB", "size: 0MB"), "workload.transfer.size", ""),
    (("version: 1", "version: 2"), "version", "not supported"),
])
def test_a_malformed_scenario_names_the_key_path(change, where, says):
    with pytest.raises(SpecError) as e:
        parse(GOOD.replace(*change, 1))
    assert e.value.path == where and says in str(e.value)


def test_an_unknown_target_names_the_targets():
    s = parse(GOOD.replace("target: wan3, ber", "target: wan9, ber"))
    p = plan_mod.build(spec.load(REPO / "topologies" / "cross-dc.yaml"), "x")
    with pytest.raises(SpecError) as e:
        scenario.check_targets(s, p)
    assert e.value.path == "events[1].target" and "wan0, wan1" in str(e.value) and "wan7" in str(e.value)
    scenario.check_targets(parse(GOOD), p)


def test_the_shipped_scenarios_are_valid():
    shipped = sorted((REPO / "scenarios").glob("*.yaml"))
    assert shipped
    for path in shipped:
        s = scenario.load(path)
        scenario.check_targets(s, plan_mod.build(spec.load(s.topology_path()), "x"))
