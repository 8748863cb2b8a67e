"""One rank of a collective, run in a host's namespace (``python -m
emulator.workload.collective_worker``): a soft-NIC and a workload.rank.Rank on it, talking to the
orchestrator (workload.collective) one JSON line at a time:

  -> {"ready": RankReady}               its QPs and staging regions, once they exist
  <- {"peers": [RankReady, ...]}        every rank's, to connect to
  <- "go"                               run the collective once (the orchestrator's barrier)
  -> {"done": RunFigures}               when it holds its result and every send is acknowledged
  <- "stop"
  -> {"result": RankResult}             its NIC's and QPs' counters

Its input is made from the seed and its rank, so the orchestrator can compute what every rank
must end with; a run reports the SHA-256 of the rank's result, checked there.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import select
import sys
import time
from dataclasses import dataclass, field

from emulator.workload import collectives as C
from emulator.workload.limits import CHUNK_BYTES
from emulator.workload.rank import Rank, RankReady
from emulator.workload.records import QpFigures
from emulator.workload.worker import add_nic_options, emit, nic_for, qp_config, qp_figures


@dataclass(frozen=True)
class RunFigures:
    """One run of the collective at one rank: wall seconds from the go to its end."""

    iteration: int
    ok: bool
    seconds: float
    started: float  # CLOCK_MONOTONIC, one clock for every namespace
    sha256: str
    sent_bytes: int
    received_bytes: int
    failed: list[dict] = field(default_factory=list)

    @classmethod
    def from_dict(cls, d: dict) -> "RunFigures":
        return cls(**d)


@dataclass(frozen=True)
class RankResult:
    rank: int
    nic: dict
    qps: list[QpFigures]

    @classmethod
    def from_dict(cls, d: dict) -> "RankResult":
        return cls(d["rank"], d["nic"], [QpFigures(**q) for q in d["qps"]])


class Orders:
    """The orchestrator's lines on stdin, read from the descriptor itself: Python's buffered
    stdin may hold a second line already read, which select() on the descriptor never shows."""

    def __init__(self) -> None:
        self._buf = b""

    def next(self, nic=None) -> dict | str:
        """The next line; with ``nic``, its loop keeps running until the line comes (a peer may
        need this rank's ACKs while the orchestrator waits on that peer)."""
        while b"\n" not in self._buf:
            if nic is not None and not select.select([0], [], [], 0)[0]:
                nic.step(0.01)
                continue
            data = os.read(0, 1 << 16)
            if not data:
                raise SystemExit("the orchestrator went away")
            self._buf += data
        line, self._buf = self._buf.split(b"\n", 1)
        text = line.decode().strip()
        return text if text in ("go", "stop") else json.loads(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m emulator.workload.collective_worker")
    ap.add_argument("--op", choices=C.OPS, required=True)
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--ips", required=True, help="every rank's address, in rank order, comma-separated")
    ap.add_argument("--channels", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--admission", type=int, default=0, help="clear-to-send window per link and channel (0: none)")
    ap.add_argument("--chunk", type=int, default=CHUNK_BYTES, help="bytes a message is cut into (emulated)")
    add_nic_options(ap)
    a = ap.parse_args(argv)
    ips = a.ips.split(",")
    lay = C.layout(a.op, a.size, len(ips), a.channels)
    data = C.input_of(lay, a.seed, a.rank)
    nic = nic_for(a)
    # The QPs this rank sends on, all at once: those to each peer it sends to.
    peers_out = len({s.dst for s in C.schedule(lay) if s.src == a.rank})
    cfg = qp_config(a.mode, a.rate, a.rtt, a.qps * peers_out, a.dilation, a.window)
    rank = Rank(nic, lay, a.rank, data, ips, a.qps, cfg, initial_psn=lambda: random.randrange(1 << 24),
                admission=a.admission, chunk=a.chunk)
    orders = Orders()
    emit("ready", rank.ready())
    rank.connect([RankReady.from_dict(p) for p in orders.next()["peers"]])
    iteration = 0
    while (cmd := orders.next(nic)) == "go":
        if iteration:
            rank.restart(data)
        sent0, recv0 = rank.sent_bytes, rank.received_bytes
        start = time.monotonic()
        ok = nic.run(rank.progress, a.timeout, busy=lambda: rank.busy) and not rank.failed
        seconds = time.monotonic() - start
        digest = hashlib.sha256(rank.result().tobytes()).hexdigest()
        emit("done", RunFigures(iteration, ok, seconds, start, digest, rank.sent_bytes - sent0,
                                 rank.received_bytes - recv0, rank.failed[:20]))
        if not ok:
            break
        iteration += 1
    # Stay up until told to stop: a peer may still need this rank's ACKs for its last packets.
    while cmd != "stop":
        cmd = orders.next(nic)
    qps = [q for qs in (*rank.out.values(), *rank.inq.values()) for q in qs]
    emit("result", RankResult(a.rank, nic.stats(), [qp_figures(q, a.dilation, None) for q in qps]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
