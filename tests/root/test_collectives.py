"""Collectives across both DCs (`backplane run collective`): each of the four operations over
four hosts, two in each DC on different leaves, the ring crossing the long-haul paths twice;
every rank's result is checked against the operation's, computed from the same seeds, on every
run; each rank put exactly nccl-tests' busbw factor x size on the wire. Every run happens once;
none is retried."""
from __future__ import annotations

import json

import pytest

from emulator.fabric import capabilities
from emulator.workload import collectives as C

from .conftest import TOPOLOGIES, bp, nothing_left

NO_DELAY = () if capabilities.has_netem() else ("--no-wan-delay",)
HOSTS = ("east-host0", "east-host2", "west-host0", "west-host2")
SIZE = "1MB"


@pytest.fixture(scope="module")
def fabric():
    name = "tcoll"
    bp("up", str(TOPOLOGIES / "cross-dc.yaml"), "--name", name, *NO_DELAY)
    try:
        yield name
    finally:
        bp("clean", "--name", name, check=False)
        assert not nothing_left(name)


@pytest.mark.parametrize("op", ["all-reduce", "all-gather", "reduce-scatter", "all-to-all"])
def test_each_collective_is_right_across_both_dcs(fabric, op):
    r = json.loads(bp("run", "collective", "-n", fabric, op, "--hosts", ",".join(HOSTS), "--size", SIZE,
                      "--channels", "2", "--qps", "4", "--iters", "2", "--json").stdout)
    text = bp("run", "collective", "-n", fabric, op, "--hosts", ",".join(HOSTS), "--size", "64KB").stdout
    print(f"\n{op}: {r['time_s']:.3f} s wall per run, busbw {r['busbw_bps'] / 1e6:.1f} Mb/s emulated, "
          f"{r['retransmits']} resent\n{text}")
    assert r["intact"] and r["complete"] and len(r["times_s"]) == 2 and r["cross_dc"]
    assert all(t > 0 for t in r["times_s"])
    n = len(HOSTS)
    for rank in r["ranks"]:
        assert [run["sha256"] for run in rank["runs"]][0] == rank["runs"][1]["sha256"]
        for run in rank["runs"]:
            assert run["ok"] and run["sent_bytes"] == run["received_bytes"] == \
                pytest.approx(C.BUSBW_FACTOR[op.replace("-", "_")](n) * r["size"])
    # The report speaks nccl-tests' columns, in real units, and says the result was checked.
    assert "intact" in text and "algbw" in text and "busbw" in text and "alpha-beta model" in text


def test_bad_requests_are_refused_before_any_work(fabric):
    bad = bp("run", "collective", "-n", fabric, "all-reduce", "--hosts", "east-host0", check=False)
    assert bad.returncode == 2 and "at least 2 hosts" in bad.stderr
    bad = bp("run", "collective", "-n", fabric, "all-reduce", "--hosts", "east-host0,east-spine0", check=False)
    assert bad.returncode == 2 and "east-spine0 is a spine" in bad.stderr
    bad = bp("run", "collective", "-n", fabric, "all-gather", "--hosts", "east-host0,west-host0", "--size", "4B",
             check=False)
    assert bad.returncode == 2 and "does not split" in bad.stderr


@pytest.mark.parametrize("profile, qps, admission", [("meta", 16, 2), ("seed", 16, 0), ("baseline", 1, 0)])
def test_each_job_profile_runs_an_all_reduce_across_both_dcs(fabric, profile, qps, admission):
    r = json.loads(bp("run", "collective", "-n", fabric, "all-reduce", "--hosts", ",".join(HOSTS), "--size", SIZE,
                      "--profile", profile, "--json").stdout)
    assert r["intact"] and r["complete"] and r["profile"] == profile
    assert r["qps"] == qps and r["admission"] == admission
    # The switches were set to the profile's hash, and the fabric says what it could not give.
    hashing = "five-tuple" if profile == "baseline" else "qpn"
    assert f"the switches now hash {hashing}" in r["notes"][0]
    assert any("pfc.enabled: false" in n for n in r["notes"]) == (profile != "baseline")


def test_a_recorded_collective_lands_in_the_run_store_and_reads_back(fabric, tmp_path):
    """`run collective --out DIR`: the manifest holds the collective's record and the port series
    shows the bytes its ranks' leaf ports sent during it; `backplane report` reads it back."""
    run_dir = tmp_path / "run"
    r = json.loads(bp("run", "collective", "-n", fabric, "all-reduce", "--hosts", ",".join(HOSTS), "--size", SIZE,
                      "--out", str(run_dir), "--json").stdout)
    assert r["intact"] and r["recorded"]["run_dir"] == str(run_dir) and "telemetry" not in r
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["workload"] == "collective"
    assert manifest["collective"]["op"] == "all_reduce" and manifest["result"]["intact"]
    assert manifest["rows"]["ports"] == r["recorded"]["ports_rows"] > 0
    import pyarrow.parquet as pq
    ports = pq.read_table(run_dir / "ports.parquet").to_pylist()
    # Each rank's leaf port towards it carried the all-reduce's share of the data during the run.
    sent = {}
    for row in ports:
        sent.setdefault(row["port"], []).append(row["deq_bytes"])
    leaf_ports = ("east-leaf0:eth0", "east-leaf1:eth0", "west-leaf0:eth0", "west-leaf1:eth0")
    share = C.BUSBW_FACTOR["all_reduce"](len(HOSTS)) * manifest["collective"]["size"]
    for port in leaf_ports:
        assert max(sent[port]) - min(sent[port]) >= share, port
    text = bp("report", str(run_dir)).stdout
    assert "all_reduce, intact" in text and "busbw" in text
