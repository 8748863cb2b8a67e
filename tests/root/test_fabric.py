"""Whole fabrics, end to end through the CLI: up, reachability, shaped rates, status, down, clean."""
from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import time

import pytest

from emulator.control import state
from emulator.fabric import capabilities, netns
from emulator.model import plan, spec

from .conftest import TOPOLOGIES, bp, bp_json, nothing_left, stolen, wait_for_quiet, watch

NO_DELAY = () if capabilities.has_netem() else ("--no-wan-delay",)
RATE_TOLERANCE = 0.05


def hosts(p: plan.FabricPlan) -> list[str]:
    return [n.name for n in p.nodes if n.role == "host"]


def ping_all_pairs(p: plan.FabricPlan) -> list[tuple[str, str]]:
    """Ping every ordered host pair once; return the pairs that got no reply."""
    failed = []
    for a, b in itertools.permutations(hosts(p), 2):
        done = netns.run(p.netns(a), ["ping", "-n", "-q", "-c", "1", "-W", "2", str(p.host_address(b))], timeout=30)
        if done.returncode != 0:
            failed.append((a, b))
    return failed


def shaped_directions(p: plan.FabricPlan):
    """(src, dst, path) for every shaped egress, borders measured end to end through their fiber."""
    out = []
    for link in p.links:
        if link.kind != "wan":
            out += [(link.a.node, link.b.node, None), (link.b.node, link.a.node, None)]
    for path in p.spec.wan_paths:
        ends = [l for l in p.links if l.kind == "wan" and l.path == path.index]
        east, west = ends[0].a.node, ends[1].b.node
        out += [(east, west, path.index), (west, east, path.index)]
    return out


def measure_every_link(p: plan.FabricPlan, tries: int = 8, quiet_budget_s: float = 180.0
                       ) -> tuple[list[str], list[str]]:
    """Links whose measured rate is off by more than 5%, and links that could not be verified.

    On this shared machine the hypervisor steals CPU now and then (seen: 18-26% for tens of
    seconds), and a stalled vCPU stalls the shaper's timers with it: the link then really
    delivers less (about 1.5x the stolen share), through no fault of its configuration. Each
    reading carries the fabric's fidelity verdict over it. A reading above the rate fails at
    once; a low reading the monitor saw no steal in counts against the link (three of them fail
    it: other processes on a 2-core machine also delay the shaper now and then); a low reading
    it saw steal in is taken again, up to ``tries`` times, after waiting for a quiet window. A
    link never measured without steal is inconclusive, not good: the caller skips, saying so.
    """
    bad, inconclusive = [], []
    quiet_deadline = time.monotonic() + quiet_budget_s  # all the waiting for quiet, per fabric
    for src, dst, path in shaped_directions(p):
        args = ["measure", "link", "--name", p.name, src, dst] + (["--path", str(path)] if path is not None else [])
        readings, quiet_low, verdict = [], 0, None
        for _ in range(tries):
            verdict_of = watch(p.name)
            r = bp_json(*args)
            steal = stolen(verdict_of())
            readings.append((round(r["ratio"], 3), steal or "no steal"))
            if r["ratio"] > 1 + RATE_TOLERANCE:
                verdict = "above the configured rate"
                break
            if r["ratio"] >= 1 - RATE_TOLERANCE:
                break
            if not steal:
                quiet_low += 1
                if quiet_low == 3:
                    verdict = "below the configured rate on a quiet machine"
                    break
            else:
                left = quiet_deadline - time.monotonic()
                if left <= 0 and len(readings) >= 2:
                    break  # out of patience for this machine: inconclusive, said below
                wait_for_quiet(min(10.0, max(left, 0.0)))
        if verdict is None and not (1 - RATE_TOLERANCE <= r["ratio"] <= 1 + RATE_TOLERANCE):
            inconclusive.append(f"{src}->{dst} path {path}: {readings}")
        if verdict:
            bad.append(f"{src}->{dst} path {path}: {verdict}: {readings} of {r['configured_bps'] / 1e6:.1f} Mbps")
    return bad, inconclusive


def skip_if_inconclusive(inconclusive: list[str]) -> None:
    if inconclusive:
        pytest.skip(f"{len(inconclusive)} links could not be verified: the fidelity monitor saw the hypervisor "
                    f"steal CPU during every reading of them (the shapers stall with it): {inconclusive}")


def test_tiny_fabric_pings_shapes_reports_and_goes_down(fabrics):
    name = fabrics("ttiny", "tiny", *NO_DELAY)
    p = plan.build(spec.load(TOPOLOGIES / "tiny.yaml"), name)
    assert ping_all_pairs(p) == []
    bad, inconclusive = measure_every_link(p)
    assert bad == []

    body = bp_json("status", "--name", name)
    assert body["name"] == name and len(body["nodes"]) == len(p.nodes)
    for link in body["links"]:
        for end in (link["a"], link["b"]):
            conf, kern = end["configured"], end["kernel"]
            if conf["kind"] == "htb":
                assert kern["kind"] == "htb" and kern["rate_bps"] == conf["rate_bps"] == 400_000_000
                assert kern["limit_bytes"] == conf["qdisc_limit_bytes"] >= conf["buffer_bytes"]
            elif NO_DELAY:
                assert conf["kind"] == "none" and kern["kind"] != "netem"
            else:
                assert kern["kind"] == "netem" and kern["delay_s"] == pytest.approx(0.015, abs=1e-5)
    assert [r["scope"] for r in body["rtt"]] == ["cross-dc"]
    assert all(r["received"] == r["sent"] > 0 and r["avg_s"] > 0 for r in body["rtt"])
    if NO_DELAY:
        assert any("NO WAN DELAY" in w for w in body["warnings"])
        assert all(not w["delay_emulated"] for w in body["wan_paths"])
        text = bp("status", "--name", name, "--no-rtt").stdout
        wan_lines = [line for line in text.splitlines() if line.strip().startswith("wan")]
        assert wan_lines and all("NO DELAY" in line for line in wan_lines)

    out = bp("down", "--name", name).stdout
    assert "down in" in out
    assert not nothing_left(name)
    skip_if_inconclusive(inconclusive)


def test_default_topology_every_pair_and_every_link(fabrics):
    name = fabrics("tdefault", "cross-dc", *NO_DELAY)
    p = plan.build(spec.load(TOPOLOGIES / "cross-dc.yaml"), name)
    assert len(hosts(p)) == 8
    assert ping_all_pairs(p) == []
    bad, inconclusive = measure_every_link(p)
    assert bad == []
    # Kernel ECMP spreads across all 8 long-haul paths on the border.
    routes = netns.run(p.netns("east-border0"), ["ip", "route", "show", "198.18.2.0/24"]).stdout
    assert routes.count("nexthop via") == 8
    bp("down", "--name", name)
    assert not nothing_left(name)
    skip_if_inconclusive(inconclusive)


def test_single_dc_baseline_pings(fabrics):
    name = fabrics("tsingle", "single-dc")
    p = plan.build(spec.load(TOPOLOGIES / "single-dc.yaml"), name)
    assert ping_all_pairs(p) == []
    body = bp_json("status", "--name", name)
    assert body["wan_paths"] == [] and body["warnings"] == []
    assert [r["scope"] for r in body["rtt"]] == ["intra-dc"]


def test_clean_after_the_controller_is_killed(fabrics):
    name = fabrics("tkill", "tiny", *NO_DELAY)
    p = plan.build(spec.load(TOPOLOGIES / "tiny.yaml"), name)
    # A process a user started inside a node must go too.
    sleeper = netns.popen(p.netns("east-host0"), ["sleep", "600"])
    rec = state.read_record(name)
    os.kill(rec.pid, signal.SIGKILL)
    status = bp("status", "--name", name, check=False)
    assert status.returncode != 0 and "clean" in status.stderr
    assert nothing_left(name)  # the crash left things behind...
    out = bp("clean", "--name", name).stdout
    assert f"fabric '{name}'" in out
    assert not nothing_left(name)  # ...and clean removed all of them
    assert sleeper.wait(timeout=10) in (-signal.SIGTERM, -signal.SIGKILL)  # ended by clean, not on its own


def test_two_named_fabrics_coexist(fabrics):
    a = fabrics("tpair1", "tiny", *NO_DELAY)
    b = fabrics("tpair2", "tiny", *NO_DELAY)
    pa = plan.build(spec.load(TOPOLOGIES / "tiny.yaml"), a)
    pb = plan.build(spec.load(TOPOLOGIES / "tiny.yaml"), b)
    assert ping_all_pairs(pa) == [] and ping_all_pairs(pb) == []
    assert bp_json("status", "--name", a, "--no-rtt")["name"] == a
    bp("down", "--name", a)
    assert not nothing_left(a)
    assert ping_all_pairs(pb) == []
    bp("down", "--name", b)
    assert not nothing_left(b)


def test_second_up_with_the_same_name_is_refused(fabrics):
    name = fabrics("tdup", "tiny", *NO_DELAY)
    again = bp("up", str(TOPOLOGIES / "tiny.yaml"), "--name", name, *NO_DELAY, check=False)
    assert again.returncode == 6 and "already" in again.stderr
    assert bp_json("status", "--name", name, "--no-rtt")["name"] == name  # the first is untouched


def test_bad_topology_fails_before_touching_the_kernel(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text((TOPOLOGIES / "tiny.yaml").read_text().replace("spines: 1, leaves: 1", "spines: -1, leaves: 1", 1))
    done = bp("up", str(bad), "--name", "tbad", check=False)
    assert done.returncode == 2
    assert str(bad) in done.stderr and "datacenters[0].spines" in done.stderr and "at least 1" in done.stderr
    assert not nothing_left("tbad")


@pytest.mark.skipif(capabilities.has_netem(), reason="this kernel has sch_netem: nothing to refuse")
def test_up_refuses_a_wan_without_netem_and_says_how_to_proceed():
    done = bp("up", str(TOPOLOGIES / "tiny.yaml"), "--name", "tnonetem", check=False)
    assert done.returncode == 3
    assert "sch_netem" in done.stderr and "--no-wan-delay" in done.stderr
    assert not nothing_left("tnonetem")


def test_down_and_status_of_a_fabric_that_is_not_up():
    for cmd in ("down", "status"):
        done = bp(cmd, "--name", "tnone", check=False)
        assert done.returncode == 5 and "tnone" in done.stderr


def test_exec_runs_inside_the_node(fabrics):
    name = fabrics("texec", "tiny", *NO_DELAY)
    p = plan.build(spec.load(TOPOLOGIES / "tiny.yaml"), name)
    out = bp("exec", "--name", name, "west-host0", "--", "ip", "-o", "-4", "addr", "show", "dev", "eth0").stdout
    assert str(p.host_address("west-host0")) in out
    missing = bp("exec", "--name", name, "nosuchnode", "--", "true", check=False)
    assert missing.returncode != 0 and "east-host0" in missing.stderr


def test_doctor_reports_each_capability_with_a_fix():
    done = bp("doctor", "--json", check=False)
    checks = {c["name"]: c for c in json.loads(done.stdout)}
    for needed in ("root", "mnexec", "iproute2", "qdisc htb", "qdisc netem", "bcc", "tshark", "clang"):
        assert needed in checks
    assert checks["qdisc netem"]["ok"] == capabilities.has_netem()
    assert all(c["ok"] or c["fix"] for c in checks.values())
    assert checks["bcc"]["ok"], checks["bcc"]


def test_no_host_sysctl_is_rewritten(fabrics):
    keys = ["net/core/wmem_max", "net/core/rmem_max", "net/ipv4/neigh/default/gc_thresh3", "net/ipv4/ip_forward"]
    before = {k: open(f"/proc/sys/{k}").read() for k in keys}
    fabrics("tsysctl", "tiny", *NO_DELAY)
    assert {k: open(f"/proc/sys/{k}").read() for k in keys} == before


def test_processes_of_the_fabric_all_carry_its_prefix(fabrics):
    name = fabrics("tprefix", "tiny", *NO_DELAY)
    shells = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout.splitlines()
    ours = [s for s in shells if "mininet:" in s and "bp-tprefix-" in s]
    assert len(ours) == len(plan.build(spec.load(TOPOLOGIES / "tiny.yaml"), name).nodes)
