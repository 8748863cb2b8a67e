"""Adaptive routing's decisions (emulator/faults/adaptive.py), its slots and its topology keys."""
from __future__ import annotations

import pytest

from emulator.errors import SpecError
from emulator.faults import routing
from emulator.faults.adaptive import HOLD_DOWN_POLLS, MIN_PACKETS, PathState, Reading, decide
from emulator.model import spec


def states() -> dict[str, PathState]:
    return {f"b:eth{i}": PathState(f"b:eth{i}", i) for i in range(4)}


def test_health_takes_a_losing_path_out_and_tries_it_again_after_the_hold_down():
    st = states()
    before = {p: Reading(0, 0, 0) for p in st}
    now = {p: Reading(1000, 0, 0) for p in st}
    now["b:eth2"] = Reading(990, 10, 0)  # 1% lost
    assert decide("health", st, before, now, 1, 1e-3, 0)
    assert st["b:eth2"].out and st["b:eth2"].loss == pytest.approx(0.01) and st["b:eth2"].times_out == 1
    assert not any(s.out for p, s in st.items() if p != "b:eth2")
    # Out, it carries nothing; it stays out for the hold-down, then is tried again.
    quiet = {p: Reading(r.sent, r.lost, 0) for p, r in now.items()}
    assert not decide("health", st, now, quiet, HOLD_DOWN_POLLS, 1e-3, 0)
    assert st["b:eth2"].sent_while_out == 0
    assert decide("health", st, quiet, quiet, 1 + HOLD_DOWN_POLLS, 1e-3, 0) and not st["b:eth2"].out


def test_health_ignores_a_loss_share_of_too_few_packets_and_one_under_the_threshold():
    st = states()
    before = {p: Reading(0, 0, 0) for p in st}
    now = {p: Reading(0, 0, 0) for p in st}
    now["b:eth0"] = Reading(MIN_PACKETS - 2, 1, 0)
    now["b:eth1"] = Reading(100_000, 50, 0)  # 5e-4 < 1e-3
    assert not decide("health", st, before, now, 1, 1e-3, 0) and not any(s.out for s in st.values())


def test_queue_weights_fall_with_depth():
    st = states()
    now = {p: Reading(0, 0, 0) for p in st}
    now["b:eth3"] = Reading(0, 0, 3000)
    assert decide("queue", st, {}, now, 1, 1e-3, 1000)
    assert st["b:eth3"].weight == 0.25 and st["b:eth0"].weight == 1.0


def test_weighted_slots():
    assert routing.weighted_slots([5, 6], {}, 64) == [5, 6]
    slots = routing.weighted_slots([5, 6, 7, 8], {5: 0.25}, 64)
    assert len(slots) == 64 and slots.count(5) == 5 and {slots.count(i) for i in (6, 7, 8)} <= {19, 20}
    assert routing.weighted_slots([5, 6], {5: 0.0, 6: 0.0}, 64) == [5, 6]


def test_the_topology_keys():
    base = "version: 1\ndatacenters: [{name: east, spines: 1, leaves: 1, hosts_per_leaf: 1, borders: 1}]\n"
    s = spec.parse(base + "ecmp: {hash: qpn, adaptive: health, flowlet_gap: 20us}\n")
    assert s.ecmp.adaptive == "health" and s.flowlet_gap() == pytest.approx(20e-6)
    assert spec.parse(base).ecmp.adaptive == "off"
    with pytest.raises(SpecError) as e:
        spec.parse(base + "ecmp: {adaptive: smart}\n")
    assert e.value.path == "ecmp.adaptive"
    with pytest.raises(SpecError) as e:
        spec.parse(base + "ecmp: {adaptive: queue, datapath: kernel}\n")
    assert e.value.path == "ecmp.adaptive"
