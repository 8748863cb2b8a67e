"""DCQCN profiles on a shared bottleneck, the emulator beside the independent reference model.

N senders write into one target at once, so the switch port to the target is the one queue they
share. For each profile (and ``off``, in the same run) the fabric is brought up with that
profile's own switch thresholds, the incast runs, and the second half of the time every sender
was active is read twice: from the emulator (the datapath's queue samples, the port's dequeued
bytes, the NICs' bytes sent) and from emulator/reference/incast.py, a per-packet model of the
same scenario and parameters written from DCQCN's sources (emulator/telemetry/modelcheck.py: the model's
range over twenty seeds, and whether the emulator lies within it give or take the tolerances
stated there). Every figure is the real fabric's (bytes / (scale x dilation), rates / scale,
times / dilation). Each run also prints its fidelity verdict.

Inside a DC, faithful (default: topologies/incast.yaml, 4 senders; about a minute per profile):
    sudo .venv/bin/python bench/dcqcn.py
The same at realtime (d = 1: a 4 KB frame is coarser than every threshold, for contrast):
    sudo .venv/bin/python bench/dcqcn.py --dilation realtime
Across the 3,000 km paths (the delay tier: in the VM where the kernel lacks netem):
    sudo .venv/bin/python bench/dcqcn.py --topology topologies/incast-wan.yaml \\
        --senders east-host0,east-host1,east-host2 --target west-host0 --flows 3 --size 3MB
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from emulator.telemetry import modelcheck, report

NAME = "bdcq"
DEFAULT_SENDERS = "dc-host0,dc-host1,dc-host2,dc-host3,dc-host4"


def bp(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "emulator.cli", *args], cwd=REPO, capture_output=True, text=True)
    if check and done.returncode != 0:
        raise SystemExit(f"backplane {' '.join(args)} failed:\n{done.stdout}{done.stderr}")
    return done


def with_profile(topology: Path, profile: str, out_dir: Path) -> Path:
    """The topology with its NICs on ``profile``, so the switches mark with that profile's own
    thresholds (the topology's ecn section still comes first)."""
    doc = yaml.safe_load(topology.read_text())
    doc.setdefault("nic", {})["dcqcn"] = profile
    out = out_dir / f"{topology.stem}-{profile}.yaml"
    out.write_text(yaml.safe_dump(doc))
    return out


def kb(tm, nbytes: float) -> str:
    return f"{tm.real_size(nbytes) / 1e3:.1f}K"


def span(tm, pair: list[float], fmt) -> str:
    lo, hi = pair
    return fmt(lo) if abs(hi - lo) < 1e-9 else f"{fmt(lo)}-{fmt(hi)}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--topology", default=str(REPO / "topologies" / "incast.yaml"))
    ap.add_argument("--dilation", default=None, help="replaces the topology's (realtime, faithful or a number)")
    ap.add_argument("--senders", default=DEFAULT_SENDERS, help="hosts to take senders from, in order")
    ap.add_argument("--target", default="dc-host5")
    ap.add_argument("--flows", default="4")
    ap.add_argument("--profiles", default="off,paper,nvidia,hpcc-ns3")
    ap.add_argument("--size", default="128MB", help="bytes per sender (emulated)")
    ap.add_argument("--sample", default=None, help="telemetry period, real time (default: 10 ms of wall time)")
    ap.add_argument("--json", dest="json_out", help="also write every run's figures here")
    args = ap.parse_args()
    pool = args.senders.split(",")
    runs = []
    bp("clean", "--name", NAME, check=False)
    with tempfile.TemporaryDirectory() as tmp:
        for n in (int(x) for x in args.flows.split(",")):
            if n > len(pool):
                raise SystemExit(f"{n} flows need {n} senders; --senders names {len(pool)}")
            header = False
            for profile in args.profiles.split(","):
                topo = with_profile(Path(args.topology), profile, Path(tmp))
                bp("up", str(topo), "--name", NAME, *(["--dilation", args.dilation] if args.dilation else []))
                started = time.monotonic()
                try:
                    extra = ["--sample", args.sample] if args.sample else []
                    done = bp("run", "transfer", "--name", NAME, ",".join(pool[:n]), args.target, "--size", args.size,
                              "--json", *extra, check=False)
                finally:
                    bp("down", "--name", NAME, check=False)
                wall = time.monotonic() - started
                if not done.stdout.strip():
                    print(f"{profile:<9} {n:>5} FAILED: {done.stderr.strip()[-300:]}")
                    continue
                r = json.loads(done.stdout)
                tm = report.time_model(r)
                if not header:
                    print(tm.line())
                    print(f"{'profile':<9} {'flows':>5} {'':>4} {'util':>11} {'Jain':>11} {'q p50':>13} {'q p90':>15} "
                          f"{'q p99':>15} {'drops':>7} {'CNPs':>9}  agree  faithful  wall")
                    header = True
                c = modelcheck.compare(r)
                e, m, ok = c["emulator"], c["model"], {k: v["ok"] for k, v in c["checks"].items()}
                mark = lambda k: "" if ok[k] else "*"  # noqa: E731
                print(f"{profile:<9} {n:>5} {'emu':>4} {e['utilisation']:>10.2f}{mark('utilisation')} "
                      f"{e['jain']:>10.3f}{mark('jain')} {kb(tm, e['queue_p50_bytes']):>12}{mark('queue_p50_bytes')} "
                      f"{kb(tm, e['queue_p90_bytes']):>14}{mark('queue_p90_bytes')} "
                      f"{kb(tm, e['queue_p99_bytes']):>14}{mark('queue_p99_bytes')} {e['drops']:>6}{mark('drops')} "
                      f"{e['cnps']:>9.0f}  {'yes' if c['agree'] else 'NO':<5}  "
                      f"{'yes' if r['fidelity']['faithful'] else 'NO':<8}  {wall:.0f} s", flush=True)
                print(f"{'':<9} {'':>5} {'model':>5} {span(tm, m['utilisation'], lambda x: f'{x:.2f}'):>10} "
                      f"{span(tm, m['jain'], lambda x: f'{x:.3f}'):>11} "
                      f"{span(tm, m['queue_p50_bytes'], lambda x: kb(tm, x)):>13} "
                      f"{span(tm, m['queue_p90_bytes'], lambda x: kb(tm, x)):>15} "
                      f"{span(tm, m['queue_p99_bytes'], lambda x: kb(tm, x)):>15} "
                      f"{span(tm, m['drops'], lambda x: f'{x:.0f}'):>7} {span(tm, m['cnps'], lambda x: f'{x:.0f}'):>9}",
                      flush=True)
                for f in r["fidelity"]["findings"]:
                    if not f["ok"]:
                        print(f"{'':<16}{f['check']}: {f['message']}")
                for x in r["fidelity"]["machine_limits"]:
                    print(f"{'':<16}machine: {x}")
                runs.append({"profile": profile, "flows": n, "compare": c, "fidelity": r["fidelity"],
                             "time_model": r["time_model"], "wall_s": wall})
    print("second half of the time all senders sent; emu: the emulator, model: the reference model's range over "
          f"{modelcheck.SEEDS} seeds; * outside the model's range by more than its tolerance (emulator/telemetry/modelcheck.py); "
          "util: the shared port's dequeued bytes over its rate; q: its depth sampled every telemetry period")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(runs, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
