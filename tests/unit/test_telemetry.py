"""The fidelity guard's verdict from two readings (no kernel needed)."""
from __future__ import annotations

from emulator.model.timemodel import TimeModel
from emulator.telemetry.ports import assess, Snapshot

TM = TimeModel(0.001)


def snap(at, softirq=0, steal=0, total=0, **drops):
    return Snapshot(at, softirq, steal, total, {k.replace("_", " "): v for k, v in drops.items()})


def test_quiet_interval_is_trustworthy():
    v = assess(snap(0, 10, 0, 1000, veth=3), snap(5, 20, 1, 2000, veth=3), TM)
    assert v["trustworthy"] and v["limits"] == [] and v["interval_s"] == 5


def test_softirq_saturation_names_the_limit_and_a_scale_that_fits():
    v = assess(snap(0, 0, 0, 0), snap(2, 950, 0, 1000), TM)
    assert not v["trustworthy"]
    (limit,) = v["limits"]
    assert "softirq took 95%" in limit and "instead of 0.001" in limit


def test_drops_outside_the_model_are_named_with_their_count():
    v = assess(snap(0, total=0, qdisc_drops_on_leaf0=2, socket=0), snap(1, total=100, qdisc_drops_on_leaf0=9, socket=0), TM)
    assert v["limits"] == ["7 qdisc drops on leaf0: outside the modelled buffers"]


def test_hypervisor_steal_is_reported():
    v = assess(snap(0), snap(1, steal=300, total=1000), TM)
    assert not v["trustworthy"] and "stole 30%" in v["limits"][0]


def test_cpu_pressure_means_senders_were_held_back():
    prev, now = snap(0, total=100), snap(2, total=200)
    prev.cpu_wait_us, now.cpu_wait_us = 0, 1_500_000
    v = assess(prev, now, TM)
    assert not v["trustworthy"] and "waited for a CPU 75%" in v["limits"][0]
    now.cpu_wait_us = 100_000
    assert assess(prev, now, TM)["trustworthy"]


def _pacing(gaps_in_bin, busy_ns, busy_bytes):
    edges = [0.25, 0.5, 0.75, 0.9, 1.1, 1.25, 1.5, 2.0, 4.0]
    return {"edges": edges, "counts": gaps_in_bin, "busy_gaps": sum(gaps_in_bin), "busy_ns": busy_ns,
            "busy_bytes": busy_bytes}


def test_a_busy_port_that_delivered_its_rate_is_faithful_and_one_that_stalled_is_not():
    rate = 400_000_000  # emulated bit/s: 50 MB/s
    zero = _pacing([0] * 10, 0, 0)
    prev = snap(0, total=100)
    prev.pacing = {"leaf1:eth0": (rate, zero), "leaf1:eth1": (rate, zero)}
    now = snap(1, total=200)
    # eth0: 1,000 gaps at the frame time, 50 MB in 1 s of busy time; eth1: half its rate, late gaps.
    now.pacing = {"leaf1:eth0": (rate, _pacing([0, 0, 0, 50, 900, 50, 0, 0, 0, 0], 10**9, 50_000_000)),
                  "leaf1:eth1": (rate, _pacing([0, 0, 0, 0, 100, 0, 0, 400, 500, 0], 10**9, 25_000_000))}
    v = assess(prev, now, TM)
    assert not v["trustworthy"]
    assert [(p["where"], p["ok"]) for p in v["pacing"]] == [("leaf1:eth0", True), ("leaf1:eth1", False)]
    assert any("leaf1:eth1" in limit and "0.500 of its rate" in limit for limit in v["limits"]), v["limits"]


def test_a_port_with_too_few_busy_gaps_says_nothing():
    zero = _pacing([0] * 10, 0, 0)
    prev, now = snap(0, total=100), snap(1, total=200)
    prev.pacing = {"p": (400_000_000, zero)}
    now.pacing = {"p": (400_000_000, _pacing([0, 0, 0, 0, 10, 0, 0, 0, 0, 0], 10**6, 1))}
    v = assess(prev, now, TM)
    assert v["trustworthy"] and v["pacing"] == []


def test_a_sender_that_fell_behind_its_rate_is_not_faithful():
    from emulator.telemetry.fidelity import nic_pacing

    t = [i * 0.01 for i in range(12)]  # 10 ms samples of wall time
    rate = [4e8] * 12  # 400 Mb/s: 500 KB allowed per interval
    steady = [k * 500_000 for k in range(12)]
    stalled = list(steady)
    for k in range(6, 12):
        stalled[k] -= 400_000  # one interval sent only 100 KB of its 500 KB
    sender = lambda tx: {"t": t, "qps": {"256": {"rate_bps": rate, "tx_bytes": tx, "unsent": [100] * 12}}}  # noqa: E731
    ok = nic_pacing(TM, {"a": sender(steady), "b": sender(steady)})
    assert ok.ok
    bad = nic_pacing(TM, {"a": sender(steady), "b": sender(stalled)})
    assert not bad.ok and "b at" in bad.message
    # Outside the time every sender sent, a stall says nothing.
    assert nic_pacing(TM, {"a": sender(steady), "b": sender(stalled)}, 0.0, 0.05).ok
