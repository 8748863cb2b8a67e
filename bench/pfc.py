"""PFC's two costs, each against a baseline measured in the same run.

1. The pause reaction: on topologies/pfc-incast.yaml (8 into 1, DCQCN off, faithful), the time
   from a port's ingress crossing XOFF in the kernel to the upstream gate shut, for every PAUSE
   of the run (the agent stamps both ends on CLOCK_MONOTONIC). Its distribution is printed in
   wall and real time, with the headroom each quantile needs on each link, against the reaction
   the computed headroom assumes (emulator/model/pfc.py) and the headroom reserved.
2. The per-packet cost of the PFC parts of the programs: tc egress (ingress accounting, the tag)
   and tc ingress (the dequeue that gives bytes back) on a lossless RoCEv2 packet, BPF_PROG_TEST_RUN
   with PFC on against the same programs with PFC off, alternating in pairs.

    sudo .venv/bin/python bench/pfc.py [--size 8MB] [--pairs 5] [--repeat 200000]
"""
from __future__ import annotations

import argparse
import json
import statistics
import struct
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from emulator.bpf import structs as S  # noqa: E402
from emulator.bpf.datapath import TC_EGRESS_PROG, TC_INGRESS_PROG  # noqa: E402
from emulator.bpf.syscall import prog_test_run  # noqa: E402
from emulator.control import client  # noqa: E402
from emulator.model import pfc as pfc_model, spec, units  # noqa: E402

import probe  # noqa: E402  (bench/probe.py)

NAME = "bpfc"
TOPOLOGY = REPO / "topologies" / "pfc-incast.yaml"
SENDERS = ",".join(f"dc-host{i}" for i in range(8))
QUANTILES = (0.5, 0.9, 0.99, 0.999, 1.0)


def bp(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "emulator.cli", *args], cwd=REPO, check=True, capture_output=True,
                          text=True)


def reaction(size: str) -> dict:
    bp("up", str(TOPOLOGY), "--name", NAME)
    try:
        run = json.loads(bp("run", "transfer", "-n", NAME, SENDERS, "dc-host9", "--size", size, "--json").stdout)
        samples = client.request(NAME, {"op": "pfc", "samples": True})["pfc"]["reactions_s"]
    finally:
        bp("down", "--name", NAME)
    return {"run": run, "samples": sorted(samples)}


def quantile(xs: list[float], q: float) -> float:
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def per_packet(pairs: int, repeat: int) -> dict:
    """ns per run of tc egress and ingress on a lossless packet, PFC off and on, in alternating pairs."""
    with probe.probe() as pr:
        dp, frame, mac = pr.datapath, pr.frame, probe.MAC
        dp.set_dscp_prio(3)

        def setup(on: bool) -> None:
            flags = S.PORT_SWITCH | (S.PORT_PFC | S.PORT_PRIO_QUEUES if on else 0)
            dp.set_port(probe.SWITCH_PORT, S.Port(7, flags, 0, 1 << 30, mac, mac, 0, 0, 1 << 30 if on else 0))
            dp.set_port(301, S.Port(7, flags, 0, 1 << 30, mac, mac, 0, 0, 1 << 30 if on else 0))
            dp.set_port(probe.FAR_PORT, S.Port(8, S.PORT_PFC if on else 0, probe.SWITCH_PORT, 0, mac, mac))
            dp.set_pfc((3,) if on else (), 1 << 30, 1 << 29)

        ctx = bytearray(192)
        struct.pack_into("=II", ctx, 36, 301, probe.SWITCH_PORT)  # __sk_buff ingress_ifindex, ifindex
        ictx = bytearray(192)
        struct.pack_into("=I", ictx, 40, probe.FAR_PORT)  # __sk_buff ifindex: the far end of the wire
        rows: dict[str, list[float]] = {"egress_off": [], "egress_on": [], "ingress_off": [], "ingress_on": []}
        for _ in range(pairs):
            for on in (False, True):
                setup(on)
                tag = "on" if on else "off"
                r = prog_test_run(dp.fds[TC_EGRESS_PROG], frame, ctx=bytes(ctx), repeat=repeat)
                rows[f"egress_{tag}"].append(r.duration_ns)
                r = prog_test_run(dp.fds[TC_INGRESS_PROG], r.data, ctx=bytes(ictx), repeat=repeat)
                rows[f"ingress_{tag}"].append(r.duration_ns)
    return {k: statistics.median(v) for k, v in rows.items()}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="8MB", help="per sender")
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=200_000)
    a = ap.parse_args()
    s = spec.load(TOPOLOGY)
    print(s.time.line())
    d = s.dilation
    r = reaction(a.size)
    xs = r["samples"]
    assumed = pfc_model.EMULATOR_REACTION_S
    print(f"pause reaction, XOFF crossed to the upstream gate shut, {len(xs)} pauses of an 8-into-1 incast "
          f"({r['run']['retransmits']} resent):")
    needed = pfc_model.needed(s)
    for q in QUANTILES:
        x = quantile(xs, q)
        rooms = ", ".join(f"{k} {units.format_size(h.frames + h.cable + h.rate_bps / 8 * (s.latency.switch_s + x / d))}"
                          for k, h in needed.items())
        print(f"  p{q * 100:g}: {x * 1e3:.2f} ms wall = {x / d * 1e6:.3f} us real ({x / assumed:.2f} x the assumed "
              f"{assumed * 1e3:g} ms); headroom it needs: {rooms}")
    print("  headroom reserved: " + ", ".join(f"{k} {units.format_size(pfc_model.reserved(s, k))}" for k in needed))
    cost = per_packet(a.pairs, a.repeat)
    print(f"per packet (median of {a.pairs} alternating pairs of {a.repeat} runs): tc egress "
          f"{cost['egress_off']:.0f} ns without PFC, {cost['egress_on']:.0f} ns with (x{cost['egress_on'] / cost['egress_off']:.2f}); "
          f"tc ingress {cost['ingress_off']:.0f} ns, {cost['ingress_on']:.0f} ns "
          f"(x{cost['ingress_on'] / cost['ingress_off']:.2f})")
    print(json.dumps({"reaction_s": {f"p{q * 100:g}": quantile(xs, q) for q in QUANTILES}, "assumed_s": assumed,
                      "pauses": len(xs), "per_packet_ns": cost}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
