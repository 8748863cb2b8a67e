"""Adaptive routing against static QPN ECMP, the same scenario and seed, in one run.

scenarios/ber-spike.yaml (wan3's bit errors rise to 1e-6 during a cross-DC 16-QP transfer) on
topologies/cross-dc.yaml with `ecmp: {hash: qpn}`, once with `adaptive: off` and once with
`adaptive: health`, alternating over --pairs; prints each run's goodput and completion time
(the tail: the transfer ends with its slowest QP), retransmissions and timeouts, the ratios
health / static, and the CPU steal seen during each run.

    sudo .venv/bin/python bench/adaptive.py [--pairs 1] [--scenario scenarios/ber-spike.yaml]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from emulator.fabric import capabilities  # noqa: E402
from emulator.telemetry.cpu import CpuWatch  # noqa: E402

NO_DELAY = () if capabilities.has_netem() else ("--no-wan-delay",)


def bp(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "emulator.cli", *args], cwd=REPO, check=True, capture_output=True,
                          text=True)


def one(tmp: Path, scenario: Path, adaptive: str, k: int) -> dict:
    doc = yaml.safe_load((REPO / "topologies" / "cross-dc.yaml").read_text())
    doc["ecmp"] = {**(doc.get("ecmp") or {}), "hash": "qpn", "adaptive": adaptive}
    topo = tmp / f"{adaptive}.yaml"
    topo.write_text(yaml.safe_dump(doc))
    name = f"bad{adaptive[:2]}"
    bp("up", str(topo), "--name", name, *NO_DELAY)
    try:
        watch = CpuWatch()
        body = json.loads(bp("run", "scenario", "-n", name, str(scenario), "--out", str(tmp / f"{adaptive}-{k}"),
                             "--json").stdout)
        steal = round(watch.steal(), 4)
        stats = json.loads(bp("stats", "-n", name, "--json").stdout)
    finally:
        bp("down", "--name", name)
    r = body["result"]
    return {"adaptive": adaptive, "goodput_bps": r["goodput_bps"], "seconds": r["seconds"],
            "retransmits": r["retransmits"], "timeouts": r["timeouts"], "intact": r["intact"] and r["complete"],
            "steal": steal, "adaptive_state": stats.get("adaptive"), "time_model": body["time_model"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=1)
    ap.add_argument("--scenario", default=str(REPO / "scenarios" / "ber-spike.yaml"))
    a = ap.parse_args()
    runs = {"off": [], "health": []}
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(a.pairs):
            for mode in ("off", "health"):
                r = one(Path(tmp), Path(a.scenario), mode, k)
                runs[mode].append(r)
                out = r["adaptive_state"]
                moved = [p["port"] for p in (out or {}).get("paths", []) if p["times_out"]]
                print(f"{mode:>7}: goodput {r['goodput_bps'] / 1e6:.1f} Mb/s (emulated), {r['seconds']:.3f} s, "
                      f"{r['retransmits']} resent, {r['timeouts']} timeouts, intact {r['intact']}, steal "
                      f"{r['steal']}{'; taken out: ' + ', '.join(moved) if out else ''}")
    med = {m: {k: statistics.median(x[k] for x in rs) for k in ("goodput_bps", "seconds")} for m, rs in runs.items()}
    ratio = {"goodput": med["health"]["goodput_bps"] / med["off"]["goodput_bps"],
             "completion_time": med["health"]["seconds"] / med["off"]["seconds"]}
    print(f"health / static: goodput x{ratio['goodput']:.3f}, completion time x{ratio['completion_time']:.3f} "
          f"(median of {a.pairs} pair(s))")
    print(json.dumps({"runs": runs, "ratio": ratio}))


if __name__ == "__main__":
    main()
