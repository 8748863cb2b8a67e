"""The fidelity guard's verdict from two readings (no kernel needed)."""
from __future__ import annotations

from emulator.telemetry import Snapshot, assess


def snap(at, softirq=0, steal=0, total=0, **drops):
    return Snapshot(at, softirq, steal, total, {k.replace("_", " "): v for k, v in drops.items()})


def test_quiet_interval_is_trustworthy():
    v = assess(snap(0, 10, 0, 1000, veth=3), snap(5, 20, 1, 2000, veth=3), 0.001)
    assert v["trustworthy"] and v["limits"] == [] and v["interval_s"] == 5


def test_softirq_saturation_names_the_limit_and_a_scale_that_fits():
    v = assess(snap(0, 0, 0, 0), snap(2, 950, 0, 1000), 0.001)
    assert not v["trustworthy"]
    (limit,) = v["limits"]
    assert "softirq took 95%" in limit and "instead of 0.001" in limit


def test_drops_outside_the_model_are_named_with_their_count():
    v = assess(snap(0, total=0, qdisc_drops_on_leaf0=2, socket=0), snap(1, total=100, qdisc_drops_on_leaf0=9, socket=0), 0.001)
    assert v["limits"] == ["7 qdisc drops on leaf0: outside the modelled buffers"]


def test_hypervisor_steal_is_reported():
    v = assess(snap(0), snap(1, steal=300, total=1000), 0.001)
    assert not v["trustworthy"] and "stole 30%" in v["limits"][0]


def test_cpu_pressure_means_senders_were_held_back():
    prev, now = snap(0, total=100), snap(2, total=200)
    prev.cpu_wait_us, now.cpu_wait_us = 0, 1_500_000
    v = assess(prev, now, 0.001)
    assert not v["trustworthy"] and "waited for a CPU 75%" in v["limits"][0]
    now.cpu_wait_us = 100_000
    assert assess(prev, now, 0.001)["trustworthy"]
