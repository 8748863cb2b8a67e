"""Forwarding rate through a chain of eBPF switches against plain kernel forwarding through the
same chain, measured in one run.

The chain is the tiny topology end to end: host, leaf, spine, border, (fiber bridge), border,
spine, leaf, host: six routers. Its links run at scale 0.01 (4 Gb/s) so that the shapers are
not the limit; the offered load is one sender as fast as it goes, small RoCE packets. On two
cores the sender and the six routers share the CPUs, so the figures are packets delivered per
second at the far host and the CPU time (all CPUs, sender included) spent per delivered packet,
for each datapath, and their ratios.

    sudo .venv/bin/python bench/forwarding.py [--packets 200000] [--payload 64]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from emulator.fabric import netns
from emulator.model import plan, spec
from emulator.telemetry import cpu

NAME = "bfwd"


def bp(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "emulator.cli", *args], cwd=REPO, check=True, capture_output=True)


def one(datapath: str, packets: int, payload: int, qps: int) -> dict:
    doc = yaml.safe_load((REPO / "topologies/tiny.yaml").read_text())
    doc["scale"] = 0.01
    doc["ecmp"] = {"hash": "qpn", "datapath": datapath}
    with tempfile.TemporaryDirectory() as tmp:
        topo = Path(tmp) / "chain.yaml"
        topo.write_text(yaml.safe_dump(doc))
        p = plan.build(spec.load(topo), NAME)
        bp("up", str(topo), "--name", NAME, "--no-wan-delay")
        try:
            dst = str(p.host_address("west-host0"))
            gen = [sys.executable, "-m", "emulator.tools.rocegen"]
            recv = netns.popen(p.netns("west-host0"), gen + ["recv", "--qps", str(qps), "--timeout", "120",
                                                             "--idle", "1.0"],
                               cwd=REPO, stdout=subprocess.PIPE, text=True)
            assert recv.stdout.readline().strip() == "ready"
            busy = cpu.read().busy
            send = netns.run(p.netns("east-host0"), gen + ["send", dst, "--qps", str(qps), "--packets",
                                                           str(packets // qps), "--payload", str(payload)],
                             timeout=600, cwd=REPO)
            sent = json.loads(send.stdout.strip().splitlines()[-1])
            got = json.loads(recv.communicate(timeout=200)[0].strip().splitlines()[-1])
            # The receiver's idle second at the end costs nothing: it waits in poll().
            busy = cpu.read().busy - busy
        finally:
            bp("down", "--name", NAME)
    pps = got["packets"] / got["first_to_last_s"] if got["first_to_last_s"] else 0.0
    return {"datapath": datapath, "sent": sent["sent"], "send_pps": sent["sent"] / sent["seconds"],
            "delivered": got["packets"], "delivered_pps": pps,
            "cpu_us_per_packet": busy / os.sysconf("SC_CLK_TCK") / max(1, got["packets"]) * 1e6}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--packets", type=int, default=200_000)
    ap.add_argument("--payload", type=int, default=64)
    ap.add_argument("--qps", type=int, default=4)
    a = ap.parse_args()
    doc = yaml.safe_load((REPO / "topologies/tiny.yaml").read_text())
    doc["scale"] = 0.01
    print(spec.parse(yaml.safe_dump(doc)).time.line() + " (forwarding rates are the machine's: emulated units)")
    results = [one(d, a.packets, a.payload, a.qps) for d in ("kernel", "ebpf")]
    for r in results:
        print(f"{r['datapath']:<7} sent {r['sent']} at {r['send_pps']:,.0f} pps, delivered {r['delivered']} "
              f"at {r['delivered_pps']:,.0f} pps through 6 routers, {r['cpu_us_per_packet']:.1f} us of CPU per packet")
    kernel, ebpf = results
    ratio = ebpf["delivered_pps"] / kernel["delivered_pps"]
    cpu_ratio = ebpf["cpu_us_per_packet"] / kernel["cpu_us_per_packet"]
    print(f"eBPF / kernel: forwarding rate {ratio:.2f}, CPU per packet {cpu_ratio:.2f}")
    print(json.dumps({"results": results, "rate_ratio": ratio, "cpu_ratio": cpu_ratio}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
