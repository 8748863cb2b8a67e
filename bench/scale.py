"""The largest cross-DC fabric this machine runs with the fidelity guard green, at each time preset.

The default cross-DC fabric (topologies/cross-dc.yaml) widened to more hosts per DC, without
delay lines so that any kernel builds it (the WAN's 15 ms are then not applied; the queues, the
shapers, ECMP over the long-haul paths and the NICs' work are). Every east host writes to its
west partner at once, all pairs started together, each moving its share of the cross-DC
capacity for about ``--seconds`` of wall time with the topology's NIC settings. Judged over
the run: the fabric's guard (the controller's "fidelity": CPU steal, softirq saturation, CPU
pressure, drops outside the modelled buffers, the dequeue pacing of every busy port) and each
transfer's own verdict (the time model's granularity, the NICs' lateness against DCQCN's loop).
A size is green only when all of them are; sizes go up until one is not.

Per preset and size: hosts, long-haul paths, the aggregate goodput in the real fabric's units
(every pair's bytes over the span from the first start to the last completion) and over the
capacity across the DCs, the NICs' CPU in cores, and the verdict with its first reason.

    sudo .venv/bin/python bench/scale.py [--hosts 4,8,16,32] [--presets realtime,faithful] [--seconds 3]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from emulator.control import client  # noqa: E402
from emulator.model import units  # noqa: E402
from emulator.telemetry import report  # noqa: E402
from emulator.telemetry.cpu import CpuWatch  # noqa: E402
from emulator.workload import transfer  # noqa: E402

NAME = "bscale"
LEAVES = 2  # per DC, as the default fabric; hosts are spread over them


def bp(*args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "emulator.cli", *args], cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"backplane {' '.join(args)} exited {done.returncode}: {done.stderr.strip()[-2000:]}")


def topology(hosts: int, where: Path) -> Path:
    """cross-dc.yaml with ``hosts`` hosts per DC."""
    doc = yaml.safe_load((REPO / "topologies" / "cross-dc.yaml").read_text())
    for dc in doc["datacenters"]:
        dc.update(leaves=LEAVES, hosts_per_leaf=-(-hosts // LEAVES))
    path = where / f"cross-dc-{hosts}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def cross_capacity_bps(fabric_spec, pairs: int) -> float:
    """What can cross between the DCs at once, emulated: the pairs' host links, the spines'
    links to the border, or the long-haul paths, whichever carries least."""
    east = next(dc for dc in fabric_spec.datacenters if dc.name == "east")
    real = min(pairs * fabric_spec.links.host, east.spines * east.borders * fabric_spec.links.border,
               sum(p.rate_bps for p in fabric_spec.wan_paths))
    return real * fabric_spec.scale


def one(hosts: int, preset: str, seconds: float, where: Path) -> dict:
    bp("up", str(topology(hosts, where)), "--name", NAME, "--no-wan-delay", "--dilation", preset)
    try:
        plan = client.running(NAME).plan
        fspec = plan.spec
        east = sorted(n.name for n in plan.by_role("host") if n.dc == "east")
        west = sorted(n.name for n in plan.by_role("host") if n.dc == "west")
        pairs = list(zip(east, west))
        capacity = cross_capacity_bps(fspec, len(pairs))
        size = int(capacity / len(pairs) / 8 * seconds) // 4096 * 4096
        cc = transfer.choose_profile(fspec, None)
        marks: list[int] = []
        # Every pair's data starts together; the guard's window opens then.
        gate = threading.Barrier(len(pairs), action=lambda: marks.append(client.request(NAME, {"op": "fidelity"})["mark"]))
        results: dict[int, object] = {}

        def run(i: int, src: str, dst: str) -> None:
            try:
                results[i] = transfer.run(plan, src, dst, size, fspec.nic.qps_per_pair, fspec.nic.transport,
                                          timeout=120 + 20 * seconds, cc=cc, on_start=lambda: gate.wait(300))
            except Exception as e:  # noqa: BLE001 - reported below, with which pair it was
                gate.abort()
                results[i] = e

        watch = CpuWatch()
        threads = [threading.Thread(target=run, args=(i, s, d)) for i, (s, d) in enumerate(pairs)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        steal = watch.steal()
        failed = [f"{pairs[i][0]} -> {pairs[i][1]}: {r}" for i, r in results.items() if isinstance(r, Exception)]
        if failed:
            raise SystemExit(f"{hosts} hosts per DC at {preset}: " + "; ".join(failed))
        machine = client.request(NAME, {"op": "fidelity", "since": marks[0]})["fidelity"]
        runs = [results[i] for i in range(len(pairs))]
        reasons = list(machine["limits"])
        for r in runs:
            v = report.fidelity(r.as_dict(), machine)
            reasons += [f["message"] for f in v["findings"] if not f["ok"]]
            if not (r.intact and r.complete):
                reasons.append(f"{r.src} -> {r.dst} did not complete intact")
        starts = [r.telemetry["t0_monotonic"] + f["started_s"] for r in runs for f in r.flows]
        ends = [r.telemetry["t0_monotonic"] + f["started_s"] + f["seconds"] for r in runs for f in r.flows]
        span = max(ends) - min(starts)
        goodput = sum(r.size for r in runs) * 8 / span
        tm = fspec.time
        return {"hosts_per_dc": hosts, "preset": preset, "scale": tm.scale, "dilation": tm.dilation,
                "hosts": 2 * len(east), "pairs": len(pairs), "paths": len(fspec.wan_paths),
                "nodes": len(plan.nodes), "bytes_per_pair": size, "span_s": span,
                "goodput_bps": goodput, "goodput_real_bps": tm.real_rate(goodput),
                "capacity_bps": capacity, "of_capacity": goodput / capacity,
                "nic_cores": sum(r.nic_cpu_s for r in runs) / span, "steal": steal,
                "retransmits": sum(r.retransmits for r in runs),
                "green": not reasons, "reasons": reasons, "machine": machine}
    finally:
        bp("down", "--name", NAME)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", default="4,8,16,32", help="hosts per DC, in increasing order")
    ap.add_argument("--presets", default="realtime,faithful")
    ap.add_argument("--seconds", type=float, default=3.0, help="wall seconds each pair's share takes at its rate")
    ap.add_argument("--json", default=None, help="write every row here")
    a = ap.parse_args()
    bp("clean", "--name", NAME)
    rows = []
    print(f"{'preset':<9} {'hosts':>5} {'paths':>5} {'nodes':>5} {'goodput (real)':>14} {'of cross-DC':>11} "
          f"{'NIC cores':>9} {'retx':>5} {'steal':>6}  guard")
    largest: dict[str, dict | None] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for preset in a.presets.split(","):
            largest[preset] = None
            for hosts in (int(h) for h in a.hosts.split(",")):
                r = one(hosts, preset, a.seconds, Path(tmp))
                rows.append(r)
                print(f"{preset:<9} {r['hosts']:>5} {r['paths']:>5} {r['nodes']:>5} "
                      f"{units.format_rate(r['goodput_real_bps']):>14} {r['of_capacity']:>11.2f} "
                      f"{r['nic_cores']:>9.2f} {r['retransmits']:>5} {r['steal']:>6.1%}  "
                      + ("green" if r["green"] else f"RED: {r['reasons'][0]}"), flush=True)
                if not r["green"]:
                    break
                largest[preset] = r
    for preset, r in largest.items():
        if r is None:
            print(f"{preset}: no size was green")
        else:
            print(f"{preset}: largest green: {r['hosts']} hosts ({r['nodes']} nodes), {r['paths']} long-haul paths, "
                  f"{units.format_rate(r['goodput_real_bps'])} aggregate goodput (real; "
                  f"{units.format_rate(r['goodput_bps'])} emulated at s = {r['scale']:g}, d = {r['dilation']:g})")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
