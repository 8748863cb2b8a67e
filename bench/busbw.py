"""busbw of a 2-rank all-reduce in one DC against the emulated line rate, measured in one run.

Two hosts on one leaf of topologies/single-dc.yaml (nothing else on the fabric) run an all-reduce
through their soft-NICs, each job profile ``--runs`` times; nccl-tests' busbw (algbw x 1 at
n = 2) over the host link's rate as read back from the kernel is the figure (goal >= 0.9: the
soft-NICs, not the emulator's CPU, should be what a reader sees). The CPU steal during each run
is beside it: a run with steal is the machine's, not the NIC's.

    sudo .venv/bin/python bench/busbw.py [--size 128MB] [--profiles default,baseline,meta,seed] [--runs 3]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from emulator.cli import jobs  # noqa: E402
from emulator.model import units  # noqa: E402
from emulator.telemetry.cpu import CpuWatch  # noqa: E402

NAME = "bbusbw"
HOSTS = ["local-host0", "local-host1"]
GOAL = 0.9


def bp(*args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "emulator.cli", *args], cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"backplane {' '.join(args)} exited {done.returncode}: {done.stderr.strip()}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="128MB", help="nccl-tests' size, emulated bytes")
    ap.add_argument("--profiles", default="default,baseline,meta,seed",
                    help="job profiles; default: the topology's own NIC settings")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", default=None, help="write every run here")
    a = ap.parse_args()
    size = units.parse_size(a.size)
    bp("up", str(REPO / "topologies" / "single-dc.yaml"), "--name", NAME)
    rows = []
    try:
        print(f"all-reduce over {', '.join(HOSTS)}, {units.format_size(size)} emulated; busbw / the host link's rate")
        print(f"{'profile':<9} {'runs':<28} {'median':>6} {'min':>6} {'steal':>6}")
        for profile in a.profiles.split(","):
            ratios, steals = [], []
            for _ in range(a.runs):
                watch = CpuWatch()
                r = jobs.collective_job(NAME, "all_reduce", HOSTS, size,
                                        profile=None if profile == "default" else profile)
                steals.append(watch.steal())
                if not (r["intact"] and r["complete"]):
                    raise SystemExit(f"{profile}: the all-reduce did not complete intact")
                ratios.append(r["busbw_bps"] / r["line_rate_bps"])
                rows.append({"profile": profile, "ratio": ratios[-1], "steal": steals[-1],
                             "retransmits": r["retransmits"], "busbw_bps": r["busbw_bps"],
                             "line_rate_bps": r["line_rate_bps"], "time_model": r["time_model"]})
            print(f"{profile:<9} {' '.join(f'{x:.2f}' for x in ratios):<28} {statistics.median(ratios):>6.2f} "
                  f"{min(ratios):>6.2f} {max(steals):>6.1%}"
                  + ("" if statistics.median(ratios) >= GOAL else f"  (below the goal {GOAL})"), flush=True)
    finally:
        bp("down", "--name", NAME)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
