"""Faults on a running fabric (`backplane inject`): a fiber cut during a cross-DC 16-QP transfer.

The cut takes one of the eight long-haul paths down both ways at once; the control plane
notices after the detection time (BFD-like, 150 ms of the real fabric) and only then withdraws
the path from the borders' ECMP groups. Checked, each as a user would:
  - the fault's timeline: taken effect at once, converged after the detection time;
  - after convergence the cut path carries nothing: the borders' eBPF counters and, on their
    own, the fiber's kernel counters stay still, while the other paths carry the transfer;
  - the transfer completes intact, selective repeat resending what the cut lost;
  - restore brings the path back into ECMP after the detection time; nothing is leaked.
Every run happens once; none is retried.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time

from emulator.control import client
from emulator.fabric import capabilities

from .conftest import REPO, bp, bp_json

NO_DELAY = () if capabilities.has_netem() else ("--no-wan-delay",)
SRC, DST, QPS, SIZE = "east-host0", "west-host0", 16, "192MB"
CUT = 3
DETECTION_S = 0.150  # real; realtime: as much wall time
# Wall seconds the cut path is watched after convergence, and the thread's lateness allowed.
WATCH_S, LATE_S = 0.5, 0.1


def paths(name: str) -> tuple[dict[int, int], dict[int, int]]:
    """Per long-haul path: packets the two borders forwarded onto it (eBPF), and packets its
    fiber's two ports received (the kernel's own interface counters)."""
    border, fiber = {}, {}
    for p in bp_json("stats", "-n", name)["ports"]:
        if "wan_path" in p:
            border[p["wan_path"]] = border.get(p["wan_path"], 0) + p["counters"]["fwd_pkts"]
        if "fiber_path" in p:
            fiber[p["fiber_path"]] = fiber.get(p["fiber_path"], 0) + p["kernel"]["rx_packets"]
    return border, fiber


def fault(name: str, fid: int) -> dict:
    return next(f for f in client.request(name, {"op": "faults"})["faults"] if f["id"] == fid)


def wait_for(name: str, fid: int, key: str, budget_s: float) -> dict:
    deadline = time.monotonic() + budget_s
    while (f := fault(name, fid))[key] is None:
        assert time.monotonic() < deadline, f"{key} never came: {f}"
        time.sleep(0.01)
    return f


def test_a_fiber_cut_is_withdrawn_after_detection_and_the_transfer_heals(fabrics):
    name = fabrics("tcut", "cross-dc", *NO_DELAY)
    transfer = subprocess.Popen([sys.executable, "-m", "emulator.cli", "run", "transfer", "-n", name, SRC, DST,
                                 "--size", SIZE, "--qps", str(QPS), "--json"], cwd=REPO, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while paths(name)[0].get(CUT, 0) == 0:  # the cut lands on a path that carries the transfer
            assert transfer.poll() is None and time.monotonic() < deadline, "no data reached the path"
            time.sleep(0.05)
        cut = bp_json("inject", "fiber-cut", "-n", name, f"wan{CUT}")["fault"]
        f = wait_for(name, cut["id"], "converged_at", 10)
        converged = f["converged_at"] - f["took_effect_at"]
        settled = paths(name)
        time.sleep(WATCH_S)  # the window the cut path is watched over
        after = paths(name)
        running = transfer.poll() is None
        out, err = transfer.communicate(timeout=300)
        assert transfer.returncode == 0, err
        r = json.loads(out)
        back = bp_json("inject", "restore", "-n", name, f"wan{CUT}")["fault"]["restored"][0]
        g = wait_for(name, back["id"], "reconverged_at", 10)
        text = bp("faults", "-n", name).stdout
    finally:
        if transfer.poll() is None:
            transfer.kill()
            transfer.communicate()
    moved = {i: after[0][i] - settled[0][i] for i in after[0]}
    fiber = {i: after[1][i] - settled[1][i] for i in after[1]}
    print(f"\n{text}\nconverged {converged:.3f} s after the cut; over {WATCH_S} s after: borders {moved}, "
          f"fibers {fiber}; transfer intact {r['intact']}, {r['retransmits']} resent")
    assert DETECTION_S <= converged <= DETECTION_S + LATE_S
    assert sorted(p.split(":")[0] for p in cut["ports"]) == ["east-border0", "west-border0"]
    assert moved[CUT] == 0 and fiber[CUT] == 0
    assert running, "the transfer ended before the window: make SIZE larger"
    assert sum(n for i, n in moved.items() if i != CUT) > 0  # it went on over the seven others
    assert r["intact"] and r["complete"] and r["retransmits"] > 0
    assert DETECTION_S <= g["reconverged_at"] - g["restored_at"] <= DETECTION_S + LATE_S
    assert f"wan{CUT}" in text and "withdrawn from ECMP: none" in text
