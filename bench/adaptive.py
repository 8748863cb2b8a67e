"""Adaptive routing against static QPN ECMP, the same scenario and seed, in one run.

scenarios/ber-spike.yaml (wan3's bit errors rise to 1e-6 during a cross-DC 16-QP transfer) on
topologies/cross-dc.yaml with `ecmp: {hash: qpn}`, once with `adaptive: off` and once with
`adaptive: health`, alternating over --pairs; prints each run's goodput and completion time
(the tail: the transfer ends with its slowest QP), retransmissions and timeouts, the ratios
health / static, and the CPU steal seen during each run. Then what adaptive routing costs per
packet: tc ingress on a RoCEv2 packet a switch forwards (BPF_PROG_TEST_RUN), off against on with the
flow's pin found and kept, and on with every packet a new flowlet (the pin written again).

    sudo .venv/bin/python bench/adaptive.py [--pairs 1] [--scenario scenarios/ber-spike.yaml]
                                            [--repeat 200000] [--skip-scenario]
"""
from __future__ import annotations

import argparse
import ipaddress
import json
import statistics
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from emulator.bpf import structs as S  # noqa: E402
from emulator.bpf.datapath import TC_INGRESS_PROG  # noqa: E402
from emulator.bpf.syscall import prog_test_run  # noqa: E402
from emulator.fabric import capabilities  # noqa: E402
from emulator.telemetry.cpu import CpuWatch  # noqa: E402

import probe  # noqa: E402  (bench/probe.py)

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


def per_packet(pairs: int, repeat: int) -> dict:
    """ns per tc ingress run on a RoCEv2 packet a switch forwards over an 8-way group: adaptive off, on
    with the flow's pin kept (a flowlet gap never reached), on with a new flowlet every packet."""
    variants = {"off": (False, 0), "pinned": (True, 0xFFFFFFFF), "new_flowlet": (True, 0)}
    with probe.probe() as pr:
        dp = pr.datapath
        dp.set_hash("qpn")
        dp.set_port(probe.SWITCH_PORT, S.Port(7, S.PORT_SWITCH, 0, 1 << 30, probe.MAC, probe.MAC))
        dp.set_port(probe.FAR_PORT, S.Port(7, S.PORT_SWITCH, 0, 1 << 30, probe.MAC, probe.MAC))
        dp.set_route(7, ipaddress.ip_network("198.18.1.0/24"), [probe.FAR_PORT] * 8)
        ctx = bytearray(192)
        struct.pack_into("=I", ctx, 40, probe.SWITCH_PORT)  # __sk_buff ifindex
        # A test run repeats on the same packet, whose TTL each forwarding takes one from: at most
        # 254 runs a call from TTL 255, as many calls as the repeat needs.
        frame, per_call = probe.roce_frame(ttl=255), 254
        calls = max(1, repeat // per_call)
        rows: dict[str, list[float]] = {k: [] for k in variants}
        for _ in range(pairs):
            for tag, (on, gap) in variants.items():
                dp.set_adaptive(on, gap)
                before = dp.counters(probe.SWITCH_PORT)["roce_pkts"]
                ns = [prog_test_run(dp.fds[TC_INGRESS_PROG], frame, ctx=bytes(ctx), repeat=per_call).duration_ns
                      for _ in range(calls)]
                # Every run took the forwarding path, not the kernel's: the figure is the real one.
                assert dp.counters(probe.SWITCH_PORT)["roce_pkts"] - before == calls * per_call, tag
                rows[tag].append(statistics.mean(ns))
    return {k: statistics.median(v) for k, v in rows.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=1)
    ap.add_argument("--scenario", default=str(REPO / "scenarios" / "ber-spike.yaml"))
    ap.add_argument("--repeat", type=int, default=200_000, help="program runs per timing")
    ap.add_argument("--skip-scenario", action="store_true", help="only the per-packet cost")
    a = ap.parse_args()
    cost = per_packet(max(a.pairs, 3), a.repeat)
    print(f"tc ingress per packet (median of {max(a.pairs, 3)} rounds of {a.repeat} runs): adaptive off "
          f"{cost['off']:.0f} ns; on, pin kept {cost['pinned']:.0f} ns (x{cost['pinned'] / cost['off']:.2f}); "
          f"on, a new flowlet each packet {cost['new_flowlet']:.0f} ns (x{cost['new_flowlet'] / cost['off']:.2f})")
    if a.skip_scenario:
        print(json.dumps({"per_packet_ns": cost}))
        return
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
    print(json.dumps({"runs": runs, "ratio": ratio, "per_packet_ns": cost}))


if __name__ == "__main__":
    main()
