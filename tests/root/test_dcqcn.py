"""DCQCN's closed loop on a real incast, run faithful, held against the independent model.

Four hosts on one leaf write into one host on the other (topologies/incast.yaml: 400 Gb/s links
at scale 1/4000, dilation faithful, so bytes, thresholds and timers are the real fabric's), so
the far leaf's port to that host is the one queue they share. Each profile runs on a fabric
brought up with that profile, so the switches mark with its own thresholds. What a user would
check, on the wire and in the queue:
  - the switch marked, the receiver answered with CNPs and every one reached its sender;
  - the shared queue's median stays at or below Kmax with nothing dropped, where the same load
    without DCQCN fills the buffer and drops;
  - over the second half of the time all four sent, queue percentiles, drops, utilisation and
    Jain's index agree with the reference model of the same scenario and parameters
    (emulator/reference/incast.py, compared by emulator/telemetry/modelcheck.py within the tolerances
    stated there);
  - the run's fidelity verdict: a run the monitor says was not faithful because the machine
    was taken from it (hypervisor steal, CPU pressure from outside) proves nothing about DCQCN
    and is skipped with the verdict; one whose NICs or queues broke the model fails.
Every run happens once; none is retried.
"""
from __future__ import annotations

import pytest
import yaml

from emulator.telemetry import modelcheck

from .conftest import TOPOLOGIES, bp, bp_json, nothing_left

SENDERS = "dc-host0,dc-host1,dc-host2,dc-host3"
TARGET = "dc-host5"
BOTTLENECK = "dc-leaf1:eth0"  # the leaf's port to dc-host5
SIZE = "128MB"  # per sender: 12-40 ms of the real fabric's time, by profile
# Without DCQCN the same four senders at line rate fill the 16 MB buffer within 0.2 ms; moving
# 128 MB each through a full buffer (three packets in four dropped and resent) would take
# minutes, and show nothing more.
OFF_SIZE = "32MB"
PROFILES = ("paper", "nvidia", "hpcc-ns3")
# What the machine does to a run from outside, rather than the emulator's own load or code.
MACHINE_WORDS = ("hypervisor stole",)


@pytest.fixture(scope="module")
def incast(tmp_path_factory):
    """incast(profile) -> the run transfer result of the 4-into-1 incast on a fabric whose
    NICs and switches run ``profile``; each profile runs once per module."""
    runs: dict[str, dict] = {}
    tmp = tmp_path_factory.mktemp("incast")

    def run(profile: str) -> dict:
        if profile not in runs:
            doc = yaml.safe_load((TOPOLOGIES / "incast.yaml").read_text())
            doc["nic"]["dcqcn"] = profile
            topo = tmp / f"incast-{profile}.yaml"
            topo.write_text(yaml.safe_dump(doc))
            name = "dcq"
            bp("up", str(topo), "--name", name)
            try:
                r = bp_json("run", "transfer", "--name", name, SENDERS, TARGET, "--size",
                            OFF_SIZE if profile == "off" else SIZE)
            finally:
                bp("clean", "--name", name, check=False)
                assert not nothing_left(name)
            assert r["intact"] and r["complete"], [s["failed"] for s in r["senders"]]
            r["bottleneck"] = next(p for p in r["figures"]["ports"] if p["port"] == BOTTLENECK)
            runs[profile] = r
        return runs[profile]

    return run


def summary(r: dict) -> str:
    q = r["bottleneck"]
    return (f"{r['rate_control']}: goodput {r['goodput_bps'] / 1e6:.0f} Mb/s emulated, {r['cnps']} CNPs, "
            f"{r['retransmits']} resent; {BOTTLENECK} depth p50/p90/p99/max {q['depth_p50']}/{q['depth_p90']}/"
            f"{q['depth_p99']}/{q['depth_max']} B, {q['ecn_marks']} marks, {q['buffer_drops']} drops, "
            f"utilisation {q['utilisation']:.2f}")


def test_without_dcqcn_the_incast_fills_the_buffer_and_drops(incast):
    r = incast("off")
    print(f"\n{summary(r)}")
    q = r["bottleneck"]
    assert r["rate_control"].startswith("none") and r["cnps"] == 0
    assert q["ecn_marks"] > 0  # the switch still marks; nobody listens
    # Four senders at line rate into one port, no window: the queue stands at the buffer.
    assert q["buffer_drops"] > 0 and r["retransmits"] >= q["buffer_drops"]
    assert q["depth_p50"] > r["telemetry"]["ecn"]["emulated_kmax"]
    assert q["depth_p50"] >= 0.9 * q["buffer_bytes"]


@pytest.mark.parametrize("profile", PROFILES)
def test_dcqcn_holds_the_queue_and_agrees_with_the_model(incast, profile):
    r = incast(profile)
    c = modelcheck.compare(r)
    verdict = r["fidelity"]
    print(f"\n{summary(r)}\nsecond half, emulator vs model range (tolerance):")
    for k, v in c["checks"].items():
        print(f"  {k:<16} {v['emulator']:>12.3f} vs {v['model']} ({v['tolerance']}): {'ok' if v['ok'] else 'DISAGREE'}")
    print(f"  fidelity: {'faithful' if verdict['faithful'] else 'NOT FAITHFUL'}: "
          f"{[f['message'] for f in verdict['findings'] if not f['ok']] + verdict['machine_limits']}")
    q = r["bottleneck"]
    kmax = r["telemetry"]["ecn"]["emulated_kmax"]
    # Whatever the machine did: the switch marked, every CNP the receiver sent reached its sender.
    assert r["rate_control"] == f"DCQCN {profile}"
    assert q["ecn_marks"] > 0 and r["cnps"] > 0
    assert sum(qp["cnps_sent"] for qp in r["receiver"]["qps"]) == r["cnps"]
    problems = []
    if q["buffer_drops"]:
        problems.append(f"{q['buffer_drops']} buffer drops")
    if q["depth_p50"] > kmax:
        problems.append(f"queue p50 {q['depth_p50']} B above Kmax {kmax} B")
    off = incast("off")["bottleneck"]
    if q["depth_p99"] >= off["depth_p50"]:
        problems.append(f"queue p99 {q['depth_p99']} B not below the p50 without DCQCN ({off['depth_p50']} B)")
    problems += [f"{k}: emulator {v['emulator']:.4g} outside the model's {v['model']} by more than {v['tolerance']}"
                 for k, v in c["checks"].items() if not v["ok"]]
    if not problems:
        return
    own = [f["message"] for f in verdict["findings"] if not f["ok"]]
    machine = [x for x in verdict["machine_limits"] if any(w in x for w in MACHINE_WORDS)]
    if machine and not own and len(machine) == len(verdict["machine_limits"]):
        pytest.skip(f"DCQCN {profile}: the fidelity monitor says the machine was taken from this run ({machine}); "
                    f"its figures prove nothing either way: {problems}")
    raise AssertionError(f"DCQCN {profile} at faithful: {problems}; fidelity: {own + verdict['machine_limits']}")


def test_a_clean_quiet_run_is_judged_faithful(fabrics):
    """One sender, nothing to congest, at faithful: the granularity is real, no NIC falls
    behind, no port misses its pacing, the machine is not out of CPU. The monitor must say so:
    a monitor that cries wolf would make every verdict worthless. The one thing outside the
    project it may still report is the hypervisor's steal, which it says in so many words."""
    name = fabrics("tquiet", TOPOLOGIES / "incast.yaml")
    r = bp_json("run", "transfer", "--name", name, "dc-host0", TARGET, "--size", "16MB")
    assert r["intact"] and r["complete"]
    verdict = r["fidelity"]
    print(f"\nfidelity of a quiet run: {verdict}")
    if not verdict["faithful"] and verdict["machine_limits"] and all(
            any(w in x for w in MACHINE_WORDS) for x in verdict["machine_limits"]):
        pytest.skip(f"the fidelity monitor saw the hypervisor steal CPU: {verdict['machine_limits']}")
    assert verdict["faithful"], verdict
    text = bp("run", "transfer", "--name", name, "dc-host0", TARGET, "--size", "4MB").stdout
    assert "fidelity: faithful" in text and "faithful (d = 4000)" in text
