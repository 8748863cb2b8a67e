"""DCQCN profiles on a shared bottleneck: Jain's fairness, utilisation and queue depth.

N senders (2, 4, 8) write into one target at once, so the switch port to the target is the
one queue they share. For each profile (and ``off``, the baseline measured in the same run):
  - utilisation of the bottleneck port (bytes it dequeued over its rate, while all sent; goal >= 0.9);
  - Jain's index of the senders' rates: over the whole run, the lowest in windows of
    ``--window`` RTTs, and when it reached 0.95 and stayed (goal: within 20 RTTs);
  - the bottleneck's depth percentiles (sampled every ``--sample``), ECN marks, buffer drops, CNPs.

Inside a DC (default: topologies/incast.yaml, 400 Mb/s emulated links):
    sudo .venv/bin/python bench/dcqcn.py
Across the 3,000 km paths, in the delay tier (netem; in the VM where the kernel lacks it):
    sudo .venv/bin/python bench/dcqcn.py --topology topologies/cross-dc.yaml \\
        --senders east-host0,east-host1,east-host2,east-host3 --target west-host0 --flows 2,4
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NAME = "bdcq"
DEFAULT_SENDERS = "dc-host0,dc-host1,dc-host2,dc-host3,dc-host4,dc-host5,dc-host6,dc-host7"


def bp(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "emulator.cli", *args], cwd=REPO, capture_output=True, text=True)
    if check and done.returncode != 0:
        raise SystemExit(f"backplane {' '.join(args)} failed:\n{done.stdout}{done.stderr}")
    return done


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--topology", default=str(REPO / "topologies" / "incast.yaml"))
    ap.add_argument("--senders", default=DEFAULT_SENDERS, help="hosts to take senders from, in order")
    ap.add_argument("--target", default="dc-host9")
    ap.add_argument("--flows", default="2,4,8")
    ap.add_argument("--profiles", default="off,paper,nvidia,hpcc-ns3")
    ap.add_argument("--size", default="8MB", help="bytes per sender")
    ap.add_argument("--sample", default="5ms")
    ap.add_argument("--json", dest="json_out", help="also write every run's figures here")
    args = ap.parse_args()
    pool = args.senders.split(",")
    bp("clean", "--name", NAME, check=False)
    bp("up", args.topology, "--name", NAME)
    runs = []
    try:
        print(f"{'profile':<9} {'flows':>5} {'util':>5} {'goodput':>9} {'Jain':>6} {'min win':>7} {'fair after':>14} "
              f"{'q p50':>7} {'q p90':>7} {'q p99':>7} {'marks':>6} {'drops':>6} {'CNPs':>6} {'retx':>6} {'CNP lag':>8} {'react':>7}")
        for n in (int(x) for x in args.flows.split(",")):
            if n > len(pool):
                raise SystemExit(f"{n} flows need {n} senders; --senders names {len(pool)}")
            for profile in args.profiles.split(","):
                done = bp("run", "transfer", "--name", NAME, ",".join(pool[:n]), args.target, "--size", args.size,
                          "--dcqcn", profile, "--sample", args.sample, "--json", check=False)
                if not done.stdout.strip():
                    print(f"{profile:<9} {n:>5} FAILED: {done.stderr.strip()[-300:]}")
                    continue
                r = json.loads(done.stdout)
                fig = r["figures"]
                port = max(fig["ports"], key=lambda p: p["utilisation"] or 0) if fig["ports"] else None
                fair = fig["fairness"]
                rtt = r["rtt_s"]
                after = (f"{fair['fair_after_s'] * 1e3:.0f} ms/{fair['fair_after_s'] / rtt:.0f} RTT"
                         if fair.get("fair_after_s") is not None else "never")
                kb = lambda b: f"{b / 1e3:.1f}K"  # noqa: E731
                delay = r["receiver"]["nic"].get("cnp_delay_s")
                lag = f"{delay['p50'] * 1e3:.2f}ms" if delay else "-"
                react = f"{fig['reaction']['p50_median'] * 1e3:.2f}ms" if fig.get("reaction") else "-"
                if port is None or port["utilisation"] is None or not fair:
                    print(f"{profile:<9} {n:>5} no bottleneck figures: {fig}")
                    continue
                print(f"{profile:<9} {n:>5} {port['utilisation']:>5.2f} {r['goodput_bps'] / 1e6:>7.1f}Mb "
                      f"{fair['jain_whole']:>6.3f} {fair['jain_min']:>7.3f} {after:>14} {kb(port['depth_p50']):>7} "
                      f"{kb(port['depth_p90']):>7} {kb(port['depth_p99']):>7} {port['ecn_marks']:>6} "
                      f"{port['buffer_drops']:>6} {r['cnps']:>6} {r['retransmits']:>6} {lag:>8} {react:>7}"
                      + ("" if r["intact"] else "  NOT INTACT"), flush=True)
                runs.append({"profile": profile, "flows": n, "bottleneck": port, "fairness": fair,
                             "goodput_bps": r["goodput_bps"], "cnps": r["cnps"], "retransmits": r["retransmits"],
                             "rtt_s": rtt, "intact": r["intact"], "cnp_delay_s": delay,
                             "cnp_reaction_s": fig.get("reaction")})
        print(f"util: the busiest switch port's dequeued bytes over its rate while all sent; Jain over "
              f"windows of max(sample, 10 RTT); RTT {runs[0]['rtt_s'] * 1e3:.2f} ms; CNP lag: median time from a "
              "marked packet's arrival to its CNP's send (the receiving NIC's loop); react: median over senders of "
              "their median time from a CNP's arrival to the rate cut (the sending NIC's loop)" if runs else "no runs")
    finally:
        bp("down", "--name", NAME, check=False)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(runs, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
