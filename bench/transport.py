"""Loss recovery on a 3,000 km path: selective repeat against go-back-N and its formula.

The soft-NIC's own state machines (emulator/nic/rc.py, the code the NICs run) on a simulated
path (emulator/tools/simnet.py): 15 ms one way, a 400 Mb/s bottleneck, each packet lost with
probability p in each direction. Time is simulated, so the figures are the protocols', not this
machine's CPU's; the real fabric's figures (VM tier, `run transfer`) are in the closing notes.

For each p it prints, normalised by the goodput C of the same transfer without loss (measured
in the same run):
  - selective repeat: goodput / (C (1-p))          (goal >= 0.95)
  - go-back-N:        goodput / C, next to the textbook U = (1-p)/(1+2ap), with a the path's
                      one-way delay in packet times (window >= 2a+1).

    .venv/bin/python bench/transport.py [--mb 200] [--qps 1]
"""
from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from emulator.tools.simnet import DROP, Net, pair
from emulator.workload.worker import PKT_WIRE, qp_config

RATE = 400e6
ONE_WAY = 0.015
CHUNK = 1 << 20


def run(mode: str, p: float, nbytes: int, seed: int) -> tuple[float, dict]:
    """Goodput (bit/s of simulated time) of one QP writing ``nbytes`` with loss ``p``."""
    cfg = qp_config(mode, RATE, 2 * ONE_WAY)
    a, b = pair(mode, a_psn=random.Random(seed).randrange(1 << 24), **{
        k: getattr(cfg, k) for k in ("max_inflight", "rx_window", "rto_initial")})
    mr = b.pd.register(bytearray(CHUNK))
    src = memoryview(random.Random(seed).randbytes(CHUNK))
    for i in range(nbytes // CHUNK):
        a.qp.post_write(i, src, mr.va, mr.rkey, signaled=False)
    rng = random.Random(seed + 1)
    net = Net(a, b, delay=ONE_WAY, pkt_time=PKT_WIRE * 8 / RATE,
              fate=lambda d, i, t: DROP if rng.random() < p else None)
    net.run(lambda: a.qp.idle or a.qp.error is not None, max_time=3600)
    assert a.qp.error is None, a.qp.error
    assert bytes(mr.buffer) == bytes(src)
    st = a.qp.stats
    return nbytes * 8 / net.now, {"retransmits": st.retransmits, "timeouts": st.timeouts,
                                  "packets": st.data_packets, "seconds": net.now}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=200, help="MiB per transfer")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    nbytes = args.mb * CHUNK
    a = ONE_WAY / (PKT_WIRE * 8 / RATE)
    base, _ = run("selective", 0.0, nbytes, args.seed)
    gbn_base, _ = run("go-back-n", 0.0, nbytes, args.seed)
    print(f"path: {ONE_WAY * 2e3:g} ms RTT, {RATE / 1e6:g} Mb/s, {PKT_WIRE} B packets (a = {a:.0f}); "
          f"{args.mb} MiB per transfer; simulated, no fabric: as at scale 0.001, dilation 1 (realtime), "
          "granularity 1000x the real fabric's")
    print(f"baseline without loss (C): selective {base / 1e6:.1f} Mb/s, go-back-N {gbn_base / 1e6:.1f} Mb/s")
    print(f"{'p':>8} {'SR/(C(1-p))':>12} {'SR retx':>8} {'SR t/o':>7} {'GBN/C':>7} {'U formula':>10} "
          f"{'GBN/U':>6} {'GBN retx':>9} {'GBN t/o':>8}")
    for p in (1e-4, 3e-4, 1e-3, 3e-3, 1e-2):
        sr, s_st = run("selective", p, nbytes, args.seed)
        gbn, g_st = run("go-back-n", p, nbytes, args.seed)
        u = (1 - p) / (1 + 2 * a * p)
        print(f"{p:>8.0e} {sr / (base * (1 - p)):>12.3f} {s_st['retransmits']:>8} {s_st['timeouts']:>7} "
              f"{gbn / gbn_base:>7.3f} {u:>10.3f} {gbn / gbn_base / u:>6.2f} {g_st['retransmits']:>9} "
              f"{g_st['timeouts']:>8}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
