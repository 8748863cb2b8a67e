"""A PFC deadlock on topologies/deadlock.yaml: reproduced, broken by the watchdog, prevented by Tagger.

Two flows bounce (down from a spine to a leaf and up again) and two more load the spines' ports
down to the bounce leaves, so that four lossless queues form a cycle, each waiting for the next:
leaf0->spine0, spine0->leaf1, leaf1->spine1, spine1->leaf0.
  - Without help the cycle locks: every queue in it holds packets, is paused, and moves nothing
    for as long as it is watched; the transfers make no progress.
  - With the watchdog started (drop), the stormed queues are dropped, the cycle unlocks and both
    transfers complete intact, the soft-NIC's selective repeat resending what was dropped.
  - With `pfc.deadlock_avoidance: tagger`, bounced packets move to priority 4: the cycle never
    closes, nothing is dropped and the watchdog (running) never fires.
Every run happens once; none is retried.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import yaml

from emulator.control import client

from .conftest import REPO, TOPOLOGIES, bp, bp_json, nothing_left, recorder, result_path, stop_recorder

# X and Y bounce; W1 and W2 load spine0 -> leaf1 and spine1 -> leaf0 (topologies/deadlock.yaml).
FLOWS = (("dc-host0", "dc-host4"), ("dc-host2", "dc-host6"), ("dc-host7", "dc-host3"), ("dc-host5", "dc-host1"))
CYCLE = ("dc-leaf0:eth2", "dc-spine0:eth1", "dc-leaf1:eth3", "dc-spine1:eth0")
PORT_OPTS = [x for q in CYCLE for x in ("--port", q)]
SIZE = "32MB"
# Wall seconds the cycle is watched to count as locked, and then again to count as staying
# locked: each is many pause times (335 ms at faithful) and RTOs of the senders.
LOCKED_S, STAYS_S = 3.0, 6.0
# A shut pause gate still lets one frame out every 4.3 s (TBF's floor, emulator/fabric/queues.py):
# locked means each queue of the cycle moved less than this share of its line rate.
TRICKLE = 1e-3
LINE_BYTES_S = 400e9 * 0.00025 / 8


def topology(tmp: Path, **pfc) -> Path:
    doc = yaml.safe_load((TOPOLOGIES / "deadlock.yaml").read_text())
    doc["pfc"].update(pfc)
    path = tmp / "deadlock.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def start(name: str) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-m", "emulator.cli", "run", "transfer", "-n", name, src, dst, "--size",
                              SIZE, "--json"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for src, dst in FLOWS]


def finish(procs: list[subprocess.Popen]) -> list[dict]:
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=300)
        assert p.returncode == 0, stderr
        out.append(json.loads(stdout))
    return out


def cycle(name: str) -> dict[str, tuple[int, int]]:
    """(depth, dequeued bytes) of each queue of the cycle."""
    ports = {p["port"]: p for p in client.request(name, {"op": "sample"})["ports"]}
    return {q: (ports[q]["depth"], ports[q]["deq_bytes"]) for q in CYCLE}


def stalled(before: dict, after: dict, seconds: float) -> bool:
    """Every queue of the cycle dequeued less than TRICKLE of its line rate in between."""
    return all(after[q][1] - before[q][1] < TRICKLE * LINE_BYTES_S * seconds for q in CYCLE)


def paused(name: str) -> dict[str, bool]:
    ports = {f"{p['node']}:{p['ifname']}": p for p in bp_json("stats", "-n", name)["ports"]}
    return {q: ports[q]["pfc"]["3"]["paused_now"] for q in CYCLE}


def drops(name: str) -> int:
    total = 0
    for p in bp_json("stats", "-n", name)["ports"]:
        total += sum(v for k, v in (p.get("counters") or {}).items() if k.startswith("drop_"))
        total += sum(r["drop_headroom"] + r["wd_tx_drop"] + r["wd_rx_drop"] for r in (p.get("pfc") or {}).values())
    return total


def test_the_cycle_locks_and_stays_locked(tmp_path):
    name = "dl"
    bp("up", str(topology(tmp_path)), "--name", name)
    procs = start(name)
    try:
        deadline = time.monotonic() + 120
        # Locked: every queue of the cycle holds packets and none moved over LOCKED_S.
        before = cycle(name)
        while True:
            time.sleep(LOCKED_S)  # the window the cycle is watched over
            now = cycle(name)
            if all(depth > 0 for depth, _ in now.values()) and stalled(before, now, LOCKED_S):
                break
            assert time.monotonic() < deadline, f"the cycle never locked: {before} -> {now}"
            before = now
        shut = paused(name)
        # And it stays so, recorded as a user would (results/deadlock-locked.png).
        d = client.request(name, {"op": "pfcwd", "cmd": "config"})["time_model"]["dilation"]
        rec = bp_json("record", "-n", name, "--for", f"{STAYS_S / d * 1e3:g}ms", *PORT_OPTS,
                      "--title", "deadlock: locked (no watchdog, no tagger)", "--plot", str(result_path("deadlock-locked.png")))
        after = cycle(name)
        bad = bp("record", "-n", name, "--for", "1ms", "--port", "dc-leaf0:eth99", check=False)
        moved = {q: after[q][1] - now[q][1] for q in CYCLE}
        recorded = {r["port"]: r for r in rec["summary"]}
        print(f"\nlocked: {now}; paused {shut}; {STAYS_S:g} s later {after}: moved {moved} bytes; recorded "
              f"{ {q: (recorded[q]['paused_share'], recorded[q]['moved_bytes']) for q in CYCLE} }")
        assert all(shut.values()), shut
        assert stalled(now, after, STAYS_S), moved
        assert all(depth > 0 for depth, _ in after.values())
        # The recording saw the same: each queue of the cycle paused throughout, deep and still.
        assert all(recorded[q]["paused_share"] == 1.0 and recorded[q]["depth_end"] > 0 for q in CYCLE)
        assert all(recorded[q]["moved_bytes"] < TRICKLE * LINE_BYTES_S * STAYS_S for q in CYCLE)
        assert bad.returncode == 2 and "no switch port dc-leaf0:eth99" in bad.stderr and CYCLE[0] in bad.stderr
        assert all(p.poll() is None for p in procs), "a transfer ended inside a deadlock"
        assert drops(name) == 0
    finally:
        for p in procs:
            p.kill()
            p.communicate()
        bp("clean", "--name", name, check=False)
        assert not nothing_left(name)


def test_the_watchdog_breaks_it(tmp_path):
    name = "dlwd"
    bp("up", str(topology(tmp_path)), "--name", name)
    try:
        bp("pfcwd", "start", "-n", name, "--action", "drop")
        rec = recorder(name, "deadlock-watchdog.png", "deadlock: broken by the watchdog (drop)")
        results = finish(start(name))
        recorded = stop_recorder(rec)
        summary = client.request(name, {"op": "pfc"})["pfc"]
        stats = bp_json("pfcwd", "show", "stats", "-n", name)["stats"]
    finally:
        bp("clean", "--name", name, check=False)
        assert not nothing_left(name)
    stormed = {r["queue"]: r for r in stats if r["storm_detected"]}
    print(f"\nwatchdog: storms {[(s['port'], round(s['detected_at'] - s['paused_at'], 3)) for s in summary['storms']]}; "
          f"{ {q: (r['tx_drop'], r['rx_drop']) for q, r in stormed.items()} }; resent "
          f"{[r['retransmits'] for r in results]}")
    assert all(r["intact"] and r["complete"] for r in results)
    assert stormed and any(r["tx_drop"] for r in stormed.values())
    # The cycle's queues were stormed (and the queues paused behind them may be too).
    assert set(q.rsplit(":", 1)[0] for q in stormed) & set(CYCLE)
    assert sum(r["retransmits"] for r in results) > 0
    # The recording has the storms and the cycle's queues moving again after them.
    assert {s["port"] for s in recorded["storms"]} == {s["port"] for s in summary["storms"]}
    moved = {r["port"]: r["moved_bytes"] for r in recorded["summary"]}
    assert all(moved.get(q, 0) > 1e6 for q in CYCLE), moved


def test_tagger_prevents_it(tmp_path):
    name = "dltag"
    bp("up", str(topology(tmp_path, deadlock_avoidance="tagger")), "--name", name)
    try:
        bp("pfcwd", "start", "-n", name, "--action", "drop")
        rec = recorder(name, "deadlock-tagger.png", "deadlock: prevented by Tagger (watchdog running)")
        results = finish(start(name))
        recorded = stop_recorder(rec)
        summary = client.request(name, {"op": "pfc"})["pfc"]
        ports = bp_json("stats", "-n", name)["ports"]
        lost = drops(name)
    finally:
        bp("clean", "--name", name, check=False)
        assert not nothing_left(name)
    tagged = {f"{p['node']}:{p['ifname']}": p["counters"]["tagged"] for p in ports
              if (p.get("counters") or {}).get("tagged")}
    print(f"\ntagger: moved to priority 4 at {tagged}; storms {summary['storms']}; drops {lost}; resent "
          f"{[r['retransmits'] for r in results]}")
    assert all(r["intact"] and r["complete"] for r in results)
    assert summary["storms"] == [] and lost == 0
    assert set(tagged) == {"dc-leaf0:eth2", "dc-leaf1:eth3"}
    # Recorded: the cycle's queues all moved the data, none sat paused throughout, no drops.
    rows = {r["port"]: r for r in recorded["summary"]}
    assert all(rows[q]["moved_bytes"] > 1e6 and rows[q]["paused_share"] < 1.0 for q in CYCLE), rows
    assert recorded["storms"] == [] and sum(r["drops"] for r in rows.values()) == 0
