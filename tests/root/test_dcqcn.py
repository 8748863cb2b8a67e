"""DCQCN closed loop on a real incast: four hosts on one leaf write into one host on the other
(topologies/incast.yaml), so the far leaf's port to that host is the one queue they share.

With DCQCN the switch marks, the receiver's NIC answers with CNPs, the senders cut their rates
and the shared queue stays low with nothing dropped; with ``off`` the same load overruns the
buffer. Every figure comes from the datapath's maps and the NICs' own counters.
"""
from __future__ import annotations

import pytest

from emulator import measure, spec

from .conftest import QUIET_STEAL, TOPOLOGIES, bp_json, wait_for_quiet

SENDERS = "dc-host0,dc-host1,dc-host2,dc-host3"
TARGET = "dc-host5"
BOTTLENECK = "dc-leaf1:eth0"  # the leaf's port to dc-host5


def incast(name: str, profile: str) -> dict:
    r = bp_json("run", "transfer", "--name", name, SENDERS, TARGET, "--size", "8MB", "--dcqcn", profile,
                "--sample", "5ms")
    assert r["intact"] and r["complete"], [s["failed"] for s in r["senders"]]
    port = next(p for p in r["figures"]["ports"] if p["port"] == BOTTLENECK)
    print(f"{profile}: {r['goodput_bps'] / 1e6:.0f} Mb/s, {r['cnps']} CNPs, {r['retransmits']} resent; "
          f"{BOTTLENECK} depth p50/p90/p99/max {port['depth_p50']}/{port['depth_p90']}/{port['depth_p99']}/"
          f"{port['depth_max']} B, {port['ecn_marks']} marks, {port['buffer_drops']} drops, "
          f"utilisation {port['utilisation']:.2f}; Jain {r['figures']['fairness']['jain_whole']:.3f}")
    return r | {"bottleneck": port}


@pytest.fixture(scope="module")
def incast_fabric():
    from .conftest import bp, nothing_left

    name = "dcq"
    bp("up", str(TOPOLOGIES / "incast.yaml"), "--name", name)
    yield name
    bp("clean", "--name", name, check=False)
    assert not nothing_left(name)


def queue_problems(r: dict, kmax: int) -> list[str]:
    """What a run's shared queue did that DCQCN should have prevented."""
    q, problems = r["bottleneck"], []
    if q["buffer_drops"]:
        problems.append(f"{q['buffer_drops']} buffer drops")
    if q["depth_p50"] > kmax:  # the queue should sit below Kmax most of the time
        problems.append(f"depth p50 {q['depth_p50']} B > Kmax {kmax} B")
    if q["depth_max"] >= q["buffer_bytes"]:
        problems.append(f"depth max {q['depth_max']} B reached the buffer")
    return problems


@pytest.mark.parametrize("profile", ["nvidia", "hpcc-ns3", "paper"])
def test_dcqcn_keeps_the_shared_queue_low_without_drops(incast_fabric, profile, tries=4):
    """The loop's speed is the receiving NIC's: a Python process on a 2-core machine, whose CNPs
    follow the marks by 0.6-2 ms here. When the hypervisor steals the CPU (seen: 9-37% for tens
    of seconds) that lag grows several-fold and the queue with it, through no fault of DCQCN's.
    So each run carries the steal measured during it: a run that keeps the queue low passes; one
    that fails on a quiet machine counts against DCQCN (two fail the test: other processes on 2
    cores delay the loop now and then); one that fails under steal is taken again after waiting
    for a quiet window. A queue never measured on a quiet machine is inconclusive: skipped, saying so.
    """
    s = spec.load(TOPOLOGIES / "incast.yaml")
    kmax = s.emulated_size(s.ecn.kmax)
    readings, quiet_failures = [], 0
    for _ in range(tries):
        watch = measure.CpuWatch()
        r = incast(incast_fabric, profile)
        steal = watch.steal()
        q = r["bottleneck"]
        # Whatever the load: the switch marked, the receiver answered every mark it acted on with
        # a CNP that reached its sender, and the senders cut their rates below half the line.
        assert r["rate_control"] == f"DCQCN {profile}"
        assert q["ecn_marks"] > 0 and r["cnps"] > 0
        assert sum(q_["cnps_sent"] for q_ in r["receiver"]["qps"]) == r["cnps"]
        rates = [x for tel in r["telemetry"]["senders"].values() for qp in tel["qps"].values()
                 for x in qp["rate_bps"]]
        assert min(rates) < 0.5 * r["line_rate_bps"]
        problems = queue_problems(r, kmax)
        if not problems:
            return
        readings.append((problems, f"steal {steal:.0%}"))
        if steal < QUIET_STEAL:
            quiet_failures += 1
            assert quiet_failures < 2, f"DCQCN {profile} let the shared queue grow on a quiet machine: {readings}"
        else:
            wait_for_quiet(30.0)
    pytest.skip(f"DCQCN {profile}: the queue could not be measured on a quiet machine "
                f"(the hypervisor stole CPU during the failing runs): {readings}")


def test_without_dcqcn_the_same_incast_overruns_the_buffer(incast_fabric):
    s = spec.load(TOPOLOGIES / "incast.yaml")
    kmax = s.emulated_size(s.ecn.kmax)
    r = incast(incast_fabric, "off")
    q = r["bottleneck"]
    assert r["rate_control"].startswith("none") and r["cnps"] == 0
    assert q["ecn_marks"] > 0  # the switch still marks; nobody listens
    assert q["buffer_drops"] > 0 and r["retransmits"] >= q["buffer_drops"]
    # Windows of 4 x 32 frames against 60 frames of buffer: the queue stands far above Kmax.
    # (p90, not the median: on a loaded machine the senders start unevenly and the median
    # sample can fall before the queue builds.)
    assert q["depth_p90"] > kmax
