"""How a fabric's up-time grows with its size: the default cross-DC fabric widened to more
spines, leaves and hosts per DC, each brought up and torn down in this process (the code the
controller runs), without delay lines so that any kernel can build it.

For each size it prints nodes, links, routes, the time up and each stage of it, the memory the
fabric took (MemAvailable before and after) and the controller's RSS, and the seconds per link
against the next smaller fabric of the same run: 1.0 is a build linear in links (the fixed
cost, chiefly the compiler's second, makes small fabrics dearer per link). The hypervisor's
steal over each build is printed beside it.

    sudo .venv/bin/python bench/build.py [--sizes 26,62,210,986] [--json]
"""
from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from emulator.bpf import install
from emulator.fabric.build import Fabric
from emulator.model import plan as plan_mod, spec
from emulator.telemetry.cpu import CpuWatch

NAME = "bbuild"
# Nodes of the fabric -> (spines, leaves, hosts per leaf) per DC; 26 is the default cross-DC.
SHAPES = {26: (2, 2, 2), 62: (2, 4, 5), 110: (4, 4, 10), 210: (4, 8, 11), 986: (8, 20, 23)}


def _available_mib() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) // 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def topology(nodes: int, where: Path) -> Path:
    spines, leaves, hosts = SHAPES[nodes]
    doc = yaml.safe_load((REPO / "topologies/cross-dc.yaml").read_text())
    for dc in doc["datacenters"]:
        dc.update(spines=spines, leaves=leaves, hosts_per_leaf=hosts)
    path = where / f"cross-dc-{nodes}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def one(nodes: int, where: Path) -> dict:
    path = topology(nodes, where)
    plan = plan_mod.build(spec.load(path), NAME)
    fabric = Fabric(plan, wan_delay=False, datapath_builder=install)
    before = _available_mib()
    watch = CpuWatch()
    started = time.monotonic()
    try:
        fabric.start()
        up = time.monotonic() - started
        steal = watch.steal()
        took = before - _available_mib()
    finally:
        fabric.stop()
    return {"nodes": len(plan.nodes), "links": len(plan.links),
            "routes": sum(len(r) for r in plan.routes.values()), "up_s": up,
            "phases": {k: round(v, 3) for k, v in fabric.phases.items()}, "memory_mib": took,
            "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024, "steal": steal}


def ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="26,62,210", help=f"fabric sizes in nodes, of {sorted(SHAPES)}")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    sizes = [int(s) for s in a.sizes.split(",")]
    bad = [s for s in sizes if s not in SHAPES]
    if bad:
        ap.error(f"no shape for {bad} nodes; sizes: {sorted(SHAPES)}")
    with tempfile.TemporaryDirectory() as tmp:
        rows = [one(n, Path(tmp)) for n in sizes]
    for before, r in zip([None] + rows, rows):
        r["s_per_link_ratio"] = None if before is None else (r["up_s"] / r["links"]) / (before["up_s"] / before["links"])
    if a.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'nodes':>6} {'links':>6} {'routes':>7} {'up s':>7} {'ms/link':>8} {'ratio':>6} {'MiB':>6} "
          f"{'rss MiB':>8} {'steal':>6}  stages (s)")
    for r in rows:
        stages = ", ".join(f"{k} {v:.2f}" for k, v in r["phases"].items())
        print(f"{r['nodes']:>6} {r['links']:>6} {r['routes']:>7} {r['up_s']:>7.2f} "
              f"{1e3 * r['up_s'] / r['links']:>8.2f} {ratio(r['s_per_link_ratio']):>6} {r['memory_mib']:>6} "
              f"{r['rss_mib']:>8} {r['steal']:>6.1%}  {stages}")
    print("ratio: seconds per link against the next smaller fabric of this run (1.0: linear in links)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
