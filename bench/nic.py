"""Soft-NIC goodput against a raw Python UDP blaster on the same path, measured in one run.

Host to host across the tiny topology (east-host0 -> west-host0: leaf, spine, border, fiber,
border, spine, leaf), without WAN delay. Two scales:
  - the default (0.001: 400 Mb/s links): both should fill the line;
  - fast (0.025: 10 Gb/s links): the links are no limit, so this compares the two programs'
    speed on this machine's CPUs (the blaster does nothing per packet but send; the NIC
    segments, checksums, paces, acknowledges and writes into memory).
The figure is the NIC's goodput (payload bytes delivered intact) over the blaster's received
payload rate (goal >= 0.6). Beside it: the CPU the two NIC processes ran (each from its start to
its last completion, the kernel's forwarding of what the sender sends included, since it runs in
the sender's sendmsg) in cores, and the goodput per such core, with the CPU steal of the run.

    sudo .venv/bin/python bench/nic.py [--seconds 3] [--qps 1,4] [--scales 0.001,0.025]
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from emulator.model import plan, spec
from emulator.telemetry import measure
from emulator.telemetry.cpu import CpuWatch
from emulator.workload import transfer

NAME = "bnic"
SRC, DST = "east-host0", "west-host0"


def bp(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "emulator.cli", *args], cwd=REPO, check=True, capture_output=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--qps", default="1,4")
    ap.add_argument("--scales", default="0.001,0.025", help="topology scales (0.025: 10 Gb/s links)")
    args = ap.parse_args()
    base = (REPO / "topologies" / "tiny.yaml").read_text()
    print(f"{'scale':>6} {'line':>9} {'blaster':>10} {'QPs':>4} {'soft-NIC':>10} {'ratio':>6} {'retx':>6} {'t/o':>4} "
          f"{'cores':>6} {'per core':>10} {'steal':>6}")
    for scale in (float(x) for x in args.scales.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            topo = Path(tmp) / "bench-nic.yaml"
            topo.write_text(base.replace("scale: 0.001", f"scale: {scale}"))
            bp("clean", "--name", NAME)
            bp("up", str(topo), "--name", NAME, "--no-wan-delay")
            try:
                fabric = plan.build(spec.load(topo), NAME)
                print(fabric.spec.time.line() + " (rates below are emulated: x 1/scale for the real fabric's)")
                port = next(fabric.ports(SRC))
                line = port.egress.rate_bps
                blast = measure.link_rate(fabric, SRC, DST, str(fabric.host_address(DST)), line,
                                          seconds=args.seconds, size=4096)
                for qps in (int(q) for q in args.qps.split(",")):
                    size = int(min(blast.payload_bps, 2e9) / 8 * args.seconds) // (1 << 20) * (1 << 20)
                    watch = CpuWatch()
                    r = transfer.run(fabric, SRC, DST, size, qps, "selective")
                    stolen = watch.steal()
                    if not (r.intact and r.complete):
                        raise SystemExit(f"transfer at scale {scale} with {qps} QPs was not intact")
                    print(f"{scale:>6g} {line / 1e6:>6.0f}Mb/s {blast.payload_bps / 1e6:>7.1f}Mb/s {qps:>4} "
                          f"{r.goodput_bps / 1e6:>7.1f}Mb/s {r.goodput_bps / blast.payload_bps:>6.2f} "
                          f"{r.retransmits:>6} {r.timeouts:>4} {r.nic_cpu_s / r.seconds:>6.2f} "
                          f"{r.goodput_per_core_bps / 1e6:>7.1f}Mb/s {stolen:>6.1%}", flush=True)
            finally:
                bp("down", "--name", NAME)
    return 0


if __name__ == "__main__":
    sys.exit(main())
