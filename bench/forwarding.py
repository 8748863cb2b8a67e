"""Forwarding rate through a chain of eBPF switches against plain kernel forwarding through the
same chain, measured in one run, in alternating rounds; beside them the datapath's floor.

The chain is the tiny topology end to end: host, leaf, spine, border, (fiber bridge), border,
spine, leaf, host: six routers. Its links run at scale 0.08 (32 Gb/s) so that the shapers are
not the limit. The load is offered by ``--senders`` processes in the first host, each sending
RoCEv2-framed datagrams in sendmmsg(2) batches as fast as the host takes them (rocegen flood:
the senders' cost per packet is the kernel's, not Python's); the far host counts them in its
interface's receive counter and drops them at a socket that never reads, so no user space
touches a delivered packet. On two cores the senders and the six routers share the CPUs: the
figures are packets per second delivered at the far host over a window while every sender is
sending, and the CPU time (all CPUs) per delivered packet over that window, for each datapath,
their ratios, and the CPU steal seen.

The floor is the eBPF datapath's forward-only build (emulator.bpf.datapath.BUILDS): the same
hooks on the same ports, the clone that frees the sender's socket, parse, route, hash, rewrite
and redirect, and nothing of the switch model (queue accounting, PFC, pacing, ECN, counters).
No datapath in these hooks can forward for less, since every hop still passes the port's qdiscs
and veth's backlog as kernel forwarding does: floor / kernel bounds what any datapath can reach
here, and ebpf / floor is what the model costs.

    sudo .venv/bin/python bench/forwarding.py [--payload 64] [--rounds 2] [--senders 2] [--window 1.0]
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from emulator.bpf.datapath import BUILD_ENV  # noqa: E402
from emulator.fabric import netns  # noqa: E402
from emulator.model import plan, spec  # noqa: E402
from emulator.nic.wire import ROCE_PORT  # noqa: E402
from emulator.telemetry import cpu  # noqa: E402
from emulator.telemetry.cpu import CpuWatch  # noqa: E402

NAME = "bfwd"
WARM_S = 0.3  # after every sender has started: the chain's queues fill, the caches warm


ARMS = ("kernel", "ebpf", "floor")
FLOOR_BUILD = "forward-only"


def bp(*args: str, env: dict | None = None) -> str:
    return subprocess.run([sys.executable, "-m", "emulator.cli", *args], cwd=REPO, check=True, capture_output=True,
                          text=True, env=env).stdout


def rx_packets(ns: str) -> int:
    """Packets the namespace's interfaces (lo aside) have received: /proc/net/dev read inside it."""
    with netns.entered(ns), open("/proc/net/dev") as f:
        lines = f.read().splitlines()[2:]
    return sum(int(line.split(":", 1)[1].split()[1]) for line in lines if line.split(":", 1)[0].strip() != "lo")


def one(arm: str, scale: float, payload: int, senders: int, qps: int, window: float) -> dict:
    doc = yaml.safe_load((REPO / "topologies/tiny.yaml").read_text())
    doc["scale"] = scale
    doc["ecmp"] = {"hash": "qpn", "datapath": "kernel" if arm == "kernel" else "ebpf"}
    env = dict(os.environ, **{BUILD_ENV: FLOOR_BUILD if arm == "floor" else "full"})
    with tempfile.TemporaryDirectory() as tmp:
        topo = Path(tmp) / "chain.yaml"
        topo.write_text(yaml.safe_dump(doc))
        p = plan.build(spec.load(topo), NAME)
        out = bp("up", str(topo), "--name", NAME, "--no-wan-delay", "--json", env=env)
        procs = []
        try:
            built = json.loads(out).get("datapath_build")
            if built != {"kernel": None, "ebpf": "full", "floor": FLOOR_BUILD}[arm]:
                raise SystemExit(f"the {arm} run's fabric came up with datapath build {built!r}")
            dst = str(p.host_address("west-host0"))
            far = p.netns("west-host0")
            # Bound, never read, with the least buffer: delivered datagrams are dropped at once.
            with netns.entered(far):
                sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            sink.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)
            sink.bind((dst, ROCE_PORT))
            gen = [sys.executable, "-m", "emulator.tools.rocegen", "flood", dst, "--qps", str(qps), "--payload",
                   str(payload), "--seconds", str(WARM_S + window + 1.0)]
            procs = [netns.popen(p.netns("east-host0"), gen + ["--pair-id", str(k)], cwd=REPO,
                                 stdout=subprocess.PIPE, text=True) for k in range(senders)]
            for proc in procs:
                if proc.stdout.readline().strip() != "sending":
                    raise SystemExit(f"a sender did not start: {proc.communicate()[0]}")
            time.sleep(WARM_S)
            watch = CpuWatch()
            busy0, rx0, t0 = cpu.read().busy, rx_packets(far), time.monotonic()
            time.sleep(window)
            busy1, rx1, t1 = cpu.read().busy, rx_packets(far), time.monotonic()
            steal = watch.steal()
            outs = [json.loads(proc.communicate(timeout=60)[0].strip().splitlines()[-1]) for proc in procs]
            sink.close()
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            bp("down", "--name", NAME)
    delivered = rx1 - rx0
    return {"datapath": arm, "delivered": delivered, "delivered_pps": delivered / (t1 - t0),
            "offered_pps": sum(o["sent"] / o["seconds"] for o in outs), "steal": steal,
            "cpu_us_per_packet": (busy1 - busy0) / os.sysconf("SC_CLK_TCK") / max(1, delivered) * 1e6}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--payload", type=int, default=64, help="bytes after the BTH (4096: a 4 KB RoCE frame)")
    ap.add_argument("--scale", type=float, default=0.08, help="the links' scale (0.08: 32 Gb/s, above the CPU)")
    ap.add_argument("--rounds", type=int, default=2, help="kernel, eBPF and the floor in turn, this many times")
    ap.add_argument("--senders", type=int, default=2, help="sending processes (one per core offers the most)")
    ap.add_argument("--qps", type=int, default=4, help="QPs per sender")
    ap.add_argument("--window", type=float, default=1.0, help="seconds counted, with every sender sending")
    ap.add_argument("--json", default=None, help="write every run here")
    a = ap.parse_args()
    doc = yaml.safe_load((REPO / "topologies/tiny.yaml").read_text())
    doc["scale"] = a.scale
    print(spec.parse(yaml.safe_dump(doc)).time.line() + " (forwarding rates are the machine's: emulated units)")
    runs = []
    for _ in range(a.rounds):
        for d in ARMS:
            r = one(d, a.scale, a.payload, a.senders, a.qps, a.window)
            runs.append(r)
            print(f"{d:<7} offered {r['offered_pps']:,.0f} pps, delivered {r['delivered_pps']:,.0f} pps through "
                  f"6 routers, {r['cpu_us_per_packet']:.2f} us of CPU per packet, steal {r['steal']:.1%}", flush=True)
    pps = {d: statistics.median(r["delivered_pps"] for r in runs if r["datapath"] == d) for d in ARMS}
    cpu_us = {d: statistics.median(r["cpu_us_per_packet"] for r in runs if r["datapath"] == d) for d in ARMS}
    rounds = [dict(zip(ARMS, runs[k:k + len(ARMS)])) for k in range(0, len(runs), len(ARMS))]
    print(f"{a.payload} B after the BTH, medians of {a.rounds} rounds, steal at most "
          f"{max(r['steal'] for r in runs):.1%}:")
    for top, bottom, what in (("ebpf", "kernel", "the datapath against kernel forwarding"),
                              ("floor", "kernel", "the floor: what any datapath in these hooks can reach"),
                              ("ebpf", "floor", "what the switch model costs")):
        each = ", ".join(f"{r[top]['delivered_pps'] / r[bottom]['delivered_pps']:.2f}" for r in rounds)
        print(f"  {top} / {bottom}: forwarding rate {pps[top] / pps[bottom]:.2f} (rounds: {each}), CPU per packet "
              f"{cpu_us[top] / cpu_us[bottom]:.2f}  ({what})")
    if a.json:
        Path(a.json).write_text(json.dumps(runs, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
