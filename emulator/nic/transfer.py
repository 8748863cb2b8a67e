"""``backplane run transfer``: RDMA WRITEs from one host's soft-NIC into another's, measured.

Two worker processes, one per host namespace (``python -m emulator.nic.transfer serve|send``),
each one soft-NIC with ``--qps`` queue pairs. They are connected out of band through this
module, as verbs applications exchange QPN and PSN (and the target's R_Key and address) over a
side channel: each worker prints a JSON ``ready`` line with its QPs and reads its peer's.

The sender fills a buffer with seeded random bytes, splits it evenly over the QPs and posts each
share as RDMA WRITEs of ``chunk`` bytes, the last with immediate data so the target learns it is
complete. It reports completion time, goodput and the transport's counters per QP. The target
reports the SHA-256 of the region it received; the transfer is intact only when both digests
match.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import select
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field

from .loop import SoftNic
from .rc import MODES, SUCCESS, QpConfig

MTU_PAYLOAD = 4096
CHUNK = 1 << 20  # bytes per RDMA WRITE work request
PKT_WIRE = MTU_PAYLOAD + 12 + 16 + 4 + 42  # a full data packet on the host link


def _config(mode: str, rate_bps: float, rtt_s: float, qps: int = 1) -> QpConfig:
    """In flight: one BDP (measured RTT x line rate, plus half again and 16 packets of slack for
    coalesced ACKs) for the NIC's QPs together, since they share the host's link; IRN caps each
    flow at a BDP, but QPs that each kept one would only queue in front of a slow receiver. The
    first timeout waits a few RTTs, until the RTT is sampled."""
    bdp = math.ceil(rate_bps / 8 * max(rtt_s, 1e-4) / PKT_WIRE) if rate_bps else 1024
    return QpConfig(mode=mode, max_inflight=max(32, int(bdp * 1.5 / max(1, qps)) + 16),
                    rx_window=max(8192, 4 * bdp), rto_initial=max(0.05, 4 * rtt_s))


def _shares(size: int, qps: int) -> list[tuple[int, int]]:
    base = size // qps
    out, off = [], 0
    for i in range(qps):
        n = base + (1 if i < size % qps else 0)
        out.append((off, n))
        off += n
    return out


def pattern(size: int, seed: int) -> bytearray:
    """Seeded random bytes, made 64 MiB at a time (randbytes refuses 256 MiB and more at once)."""
    out = bytearray(size)
    step = 64 << 20
    for i, off in enumerate(range(0, size, step)):
        n = min(step, size - off)
        out[off:off + n] = random.Random(seed * 1_000_003 + i).randbytes(n)
    return out


def _emit(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _read() -> dict:
    line = sys.stdin.readline()
    if not line:
        raise SystemExit("the controller went away")
    return json.loads(line)


def _qp_figures(qp) -> dict:
    st = qp.stats
    return {"qpn": qp.qpn, "data_packets": st.data_packets, "retransmits": st.retransmits, "timeouts": st.timeouts,
            "acks_received": st.acks_received, "naks_received": st.naks_received, "delivered": st.delivered,
            "held": st.held, "naks_sent": st.naks_sent, "acks_sent": st.acks_sent,
            "srtt_s": qp.srtt, "rto_s": qp.rto, "dropped": dict(st.dropped), "error": qp.error}


def _open(a: argparse.Namespace) -> tuple[SoftNic, list]:
    nic = SoftNic(a.ip, a.rate, a.burst)
    cfg = _config(a.mode, a.rate, a.rtt, a.qps)
    return nic, [nic.create_qp(a.peer, cfg, initial_psn=random.randrange(1 << 24)) for _ in range(a.qps)]


def _exchange(qps: list, **extra) -> dict:
    """Say our QPs (and ``extra``) on stdout, read the peer's on stdin, connect QP to QP."""
    _emit({"ready": {"qps": [{"qpn": q.qpn, "psn": q.ipsn} for q in qps], **extra}})
    peer = _read()
    for qp, p in zip(qps, peer["qps"]):
        qp.connect(p["qpn"], p["psn"])
    return peer


def serve(a: argparse.Namespace) -> int:
    nic, qps = _open(a)
    mr = nic.pd.register(bytearray(a.size))
    for i, qp in enumerate(qps):
        qp.post_recv(i, bytearray(0))
    _exchange(qps, rkey=mr.rkey, va=mr.va)
    done: dict[int, float] = {}
    start = time.monotonic()

    def finished() -> bool:
        for qp in qps:
            for wc in qp.recv_cq.poll():
                done[qp.qpn] = time.monotonic() - start
        return len(done) == len(qps)

    ok = nic.run(finished, a.timeout)
    # Stay up until told: the sender may still need ACKs for its last packets.
    while not select.select([sys.stdin], [], [], 0)[0]:
        nic.step(0.01)
    digest = hashlib.sha256(mr.buffer).hexdigest()
    _emit({"result": {"complete": ok, "sha256": digest, "nic": nic.stats(),
                      "qps": [_qp_figures(q) | {"completed_s": done.get(q.qpn)} for q in qps]}})
    return 0


def send(a: argparse.Namespace) -> int:
    nic, qps = _open(a)
    data = pattern(a.size, a.seed)
    digest = hashlib.sha256(data).hexdigest()
    peer = _exchange(qps)
    view = memoryview(data)
    expected = 0
    for i, (qp, (off, n)) in enumerate(zip(qps, _shares(a.size, a.qps))):
        chunks = range(off, off + n, a.chunk) if n else [off]
        for k, c in enumerate(chunks):
            last = k == len(chunks) - 1
            qp.post_write(c, view[c:min(c + a.chunk, off + n)], peer["va"] + c, peer["rkey"], imm=i if last else None)
            expected += 1
    completed: dict[int, float] = {}
    failed: list[dict] = []
    got = 0
    start = time.monotonic()

    def finished() -> bool:
        nonlocal got
        for qp in qps:
            for wc in qp.send_cq.poll():
                got += 1
                if wc.status != SUCCESS:
                    failed.append({"qpn": qp.qpn, "wr_id": wc.wr_id, "status": wc.status})
            if qp.idle and qp.qpn not in completed:
                completed[qp.qpn] = time.monotonic() - start
        return got == expected

    ok = nic.run(finished, a.timeout)
    seconds = time.monotonic() - start
    _emit({"result": {"complete": ok and not failed, "sha256": digest, "seconds": seconds, "bytes": a.size,
                      "goodput_bps": a.size * 8 / seconds if ok and not failed else 0.0, "failed": failed[:20],
                      "nic": nic.stats(),
                      "qps": [_qp_figures(q) | {"completed_s": completed.get(q.qpn)} for q in qps]}})
    return 0


# --- the orchestrator, run by the CLI in the root namespace ---

@dataclass
class TransferResult:
    src: str
    dst: str
    transport: str
    size: int
    qps: int
    intact: bool
    complete: bool
    seconds: float
    goodput_bps: float
    line_rate_bps: int
    rtt_s: float
    # Rate control the NICs ran. DCQCN's state machines exist (nic/dcqcn.py) but transfers do
    # not run them yet, whatever the topology's nic.dcqcn says: reported, not implied.
    rate_control: str
    retransmits: int
    timeouts: int
    data_packets: int
    sender: dict = field(repr=False)
    receiver: dict = field(repr=False)

    def as_dict(self) -> dict:
        return asdict(self)


def _path_rtt(plan, src: str, dst: str, tries: int = 4) -> float:
    """The RTT that sizes the window: the least of a few pings, once they agree. Pings that
    waited behind a neighbour lookup (an ARP lost on a lossy path costs a second) arrive
    spaced by their interval and are not the path's RTT: measure again."""
    from .. import measure

    best = float("inf")
    for _ in range(tries):
        r = measure.rtt(plan, src, dst, count=3, interval=0.05)
        best = min(best, r.min_s)
        if r.max_s <= 2 * r.min_s + 0.002:
            break
    return best


def _host_port(plan, host: str):
    ports = list(plan.ports(host))
    if plan.node(host).role != "host" or not ports:
        raise ValueError(f"{host} is not a host")
    return ports[0]


def run(plan, src: str, dst: str, size: int, qps: int, transport: str, timeout: float = 300.0,
        chunk: int = CHUNK, seed: int = 1, rate_bps: float | None = None) -> TransferResult:
    """Move ``size`` bytes from host ``src`` to host ``dst`` over ``qps`` QPs and check them.
    The NICs send at the host link's rate, or at ``rate_bps`` if that is given."""
    from .. import netns
    from ..errors import MeasurementError

    if transport not in MODES:
        raise MeasurementError(f"transport {transport!r}: use one of {', '.join(MODES)}")
    port = _host_port(plan, src)
    _host_port(plan, dst)
    rate = rate_bps or port.egress.rate_bps
    src_ip, dst_ip = str(port.address.ip), str(plan.host_address(dst))
    rtt = _path_rtt(plan, src, dst)
    # The NIC's serialiser may run ahead of the line by what the host's egress queue holds.
    burst = max(2 * PKT_WIRE, port.egress.qdisc_limit - PKT_WIRE)
    common = ["--qps", str(qps), "--size", str(size), "--mode", transport, "--rate", str(rate),
              "--burst", str(burst), "--rtt", str(rtt), "--timeout", str(timeout)]
    py = [sys.executable, "-m", "emulator.nic.transfer"]
    procs = []

    def start(host: str, argv: list[str]) -> tuple[subprocess.Popen, dict]:
        p = netns.popen(plan.netns(host), py + argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE, text=True)
        procs.append(p)
        line = p.stdout.readline()
        if not line:
            raise MeasurementError(f"soft-NIC on {host} did not start: {p.stderr.read().strip()}")
        return p, json.loads(line)["ready"]

    def result(p: subprocess.Popen, host: str, wait: float) -> dict:
        if not select.select([p.stdout], [], [], wait)[0]:
            raise MeasurementError(f"soft-NIC on {host} gave no result within {wait:g} s")
        line = p.stdout.readline()
        if not line:
            raise MeasurementError(f"soft-NIC on {host} ended without a result: {p.stderr.read().strip()[-2000:]}")
        return json.loads(line)["result"]

    try:
        server, s_ready = start(dst, ["serve", "--ip", dst_ip, "--peer", src_ip, *common])
        client, c_ready = start(src, ["send", "--ip", src_ip, "--peer", dst_ip, "--chunk", str(chunk),
                                      "--seed", str(seed), *common])
        server.stdin.write(json.dumps(c_ready) + "\n")
        server.stdin.flush()
        client.stdin.write(json.dumps(s_ready) + "\n")
        client.stdin.flush()
        sent = result(client, src, timeout + 30)
        server.stdin.write("stop\n")
        server.stdin.flush()
        got = result(server, dst, 30)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    qsum = lambda key: sum(q[key] for q in sent["qps"])  # noqa: E731
    return TransferResult(src, dst, transport, size, qps, intact=sent["sha256"] == got["sha256"] and got["complete"],
                          complete=sent["complete"], seconds=sent["seconds"], goodput_bps=sent["goodput_bps"],
                          line_rate_bps=rate, rtt_s=rtt, rate_control="none (line-rate pacing only)", retransmits=qsum("retransmits"), timeouts=qsum("timeouts"),
                          data_packets=qsum("data_packets"), sender=sent, receiver=got)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m emulator.nic.transfer")
    ap.add_argument("role", choices=("serve", "send"))
    ap.add_argument("--ip", required=True)
    ap.add_argument("--peer", required=True)
    ap.add_argument("--qps", type=int, default=1)
    ap.add_argument("--size", type=int, required=True)
    ap.add_argument("--mode", choices=MODES, default="selective")
    ap.add_argument("--rate", type=float, default=0.0, help="line rate, bit/s (0: unpaced)")
    ap.add_argument("--burst", type=int, default=64 << 10)
    ap.add_argument("--rtt", type=float, default=0.001, help="measured RTT, s: sizes the window")
    ap.add_argument("--chunk", type=int, default=CHUNK)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=300.0)
    a = ap.parse_args(argv)
    return serve(a) if a.role == "serve" else send(a)


if __name__ == "__main__":
    sys.exit(main())
