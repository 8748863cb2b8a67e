"""RoCEv2-framed load: many QPs' worth of BTH-headed UDP datagrams, and a counting receiver.

An instrument for the switches, not a NIC (the soft-NIC is emulator/nic): each packet is a
RoCEv2 RDMA WRITE MIDDLE (BTH, payload, 4-byte ICRC field left zero) to UDP 4791 with UDP
checksum 0, DSCP 26 and ECT(0), as RoCE NICs send data. Each QP has its own destination QPN
and a PSN that rises by one per packet, so the receiver can count, per QP, what arrived, how
much came out of order (what per-packet spraying costs) and how much carried CE.

The UDP source port is the entropy a five-tuple hash sees: ``--sport pair`` keeps one port for
all QPs between two hosts (what Meta's NICs did, and why it built E-ECMP on the QPN);
``--sport qp`` gives each QP its own (an entropy value, as Ultra Ethernet does).

Run inside a host's namespace: ``python -m emulator.tools.rocegen recv|send ...``. The receiver
prints ``ready`` once bound and one JSON line when every QP's last packet (opcode
RDMA WRITE LAST) and all before it have come, or as many packets as it is told the senders
sent (``expect N`` on stdin), or a drain time after being told, or on its timeout.
"""
from __future__ import annotations

import argparse
import ctypes as ct
import json
import select
import socket
import sys
import time

from emulator.nic.loop import QPN_BASE, SO_NO_CHECK, SPORT_BASE
from emulator.nic.wire import BTH_STRUCT, CE, DSCP_DATA, ECT0, ROCE_PORT, WRITE_LAST, WRITE_MIDDLE

# How far a paced sender may catch up after falling behind: enough to make up for sleep()
# overshooting, too little to turn a descheduled moment into a line-rate burst (50 ms behind at
# 3,000 pps would be 150 frames back to back, more than a 16 KB switch buffer holds).
CATCH_UP_S = 2e-3
IP_RECVTOS = 13  # each datagram's TOS (ECN) as ancillary data (Python does not name it)


def qpn_of(qp: int) -> int:
    return QPN_BASE + qp


def send(dst: str, qps: int, packets: int, payload: int, pps: float, sport_mode: str, pair_id: int,
         burst: int = 1, sndbuf: int = 0, gate: bool = False) -> dict:
    """Round-robin over the QPs, ``burst`` packets of a QP back to back, ``packets`` per QP, paced
    at ``pps`` in total (0: as fast as the host's NIC takes them; with a small ``sndbuf`` the
    socket blocks while its NIC queue is full instead of overflowing it). A sender that fell
    behind catches up by at most CATCH_UP_S. The last packet of each QP is an RDMA WRITE LAST.
    With ``gate`` it prints ``ready`` once its sockets are open and sends when a line comes on
    stdin: senders in several hosts then start together, not a process start-up apart."""
    socks = []
    for qp in range(qps):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.setsockopt(socket.SOL_SOCKET, SO_NO_CHECK, 1)  # RoCEv2 sends UDP checksum 0
        s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, (DSCP_DATA << 2) | ECT0)
        sport = SPORT_BASE + (pair_id * 1024 + (qp if sport_mode == "qp" else 0)) % 16384
        if sport_mode == "pair" and qp > 0:
            s.close()
            socks.append(socks[0])
            continue
        if sndbuf:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
        s.bind(("0.0.0.0", sport))
        s.connect((dst, ROCE_PORT))
        socks.append(s)
    body = bytes(payload) + bytes(4)  # payload, then the ICRC field
    if gate:
        print("ready", flush=True)
        sys.stdin.readline()
    interval = 1.0 / pps if pps > 0 else 0.0
    started = time.monotonic()
    next_at = started
    sent = errors = 0
    order = [(qp, i) for first in range(0, packets, burst) for qp in range(qps)
             for i in range(first, min(first + burst, packets))]
    for qp, i in order:
        op = WRITE_LAST if i == packets - 1 else WRITE_MIDDLE
        pkt = BTH_STRUCT.pack(op, 0, 0xFFFF, qpn_of(qp), i & 0xFFFFFF) + body
        if interval:
            # Pace the average rate, but let a burst go back to back.
            now = time.monotonic()
            if i % burst == 0 and now < next_at:
                time.sleep(next_at - now)
            next_at = max(next_at, now - CATCH_UP_S)
            next_at += interval
        try:
            socks[qp].send(pkt)
            sent += 1
        except OSError:
            errors += 1
    seconds = time.monotonic() - started
    return {"sent": sent, "send_errors": errors, "seconds": seconds}


class _Iovec(ct.Structure):
    _fields_ = [("base", ct.c_void_p), ("len", ct.c_size_t)]


class _Msghdr(ct.Structure):
    _fields_ = [("name", ct.c_void_p), ("namelen", ct.c_uint32), ("iov", ct.POINTER(_Iovec)),
                ("iovlen", ct.c_size_t), ("control", ct.c_void_p), ("controllen", ct.c_size_t),
                ("flags", ct.c_int)]


class _Mmsghdr(ct.Structure):
    _fields_ = [("hdr", _Msghdr), ("len", ct.c_uint)]


def flood(dst: str, qps: int, payload: int, seconds: float, batch: int, pair_id: int) -> dict:
    """Offer as much as the host takes for ``seconds``: ``batch`` packets of a QP per sendmmsg(2)
    (one system call for them, so the sender's own cost per packet is the kernel's, not
    Python's), the QPs in turn. An instrument for the switches' forwarding rate: nothing is
    paced and what a full queue drops is not resent. Prints ``sending`` as it starts."""
    libc = ct.CDLL(None, use_errno=True)
    socks, vecs, keep = [], [], []
    for qp in range(qps):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.setsockopt(socket.SOL_SOCKET, SO_NO_CHECK, 1)
        s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, (DSCP_DATA << 2) | ECT0)
        s.bind(("0.0.0.0", SPORT_BASE + (pair_id * 1024 + qp) % 16384))
        s.connect((dst, ROCE_PORT))
        socks.append(s)
        pkt = ct.create_string_buffer(BTH_STRUCT.pack(WRITE_MIDDLE, 0, 0xFFFF, qpn_of(pair_id * 1024 + qp), 0)
                                      + bytes(payload) + bytes(4))
        iov = _Iovec(ct.cast(pkt, ct.c_void_p), len(pkt.raw) - 1)
        msgs = (_Mmsghdr * batch)()
        for m in msgs:
            m.hdr.iov, m.hdr.iovlen = ct.pointer(iov), 1
        keep += [pkt, iov]
        vecs.append(msgs)
    print("sending", flush=True)
    started = time.monotonic()
    end = started + seconds
    sent = calls = 0
    while time.monotonic() < end:
        for s, msgs in zip(socks, vecs):
            n = libc.sendmmsg(s.fileno(), msgs, batch, 0)
            calls += 1
            if n > 0:
                sent += n
    return {"sent": sent, "calls": calls, "seconds": time.monotonic() - started, "started": started}


def receive(qps_expected: int, timeout: float, drain: float = 2.0, idle: float = 0.0) -> dict:
    """Count what arrives until every QP's last packet and all before it came, or until the
    packets the senders report sent (an ``expect N`` line on stdin) came, or ``drain`` seconds
    after that line (what is still missing then was lost), or ``timeout``; with ``idle``, also
    once nothing came for that long (for a shell that cannot say what was sent)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    sock.setsockopt(socket.IPPROTO_IP, IP_RECVTOS, 1)
    sock.bind(("0.0.0.0", ROCE_PORT))
    sock.setblocking(False)
    print("ready", flush=True)
    flows: dict[str, dict] = {}
    done = set()
    malformed = 0
    packets = 0
    deadline = time.monotonic() + timeout
    expected: int | None = None
    first = last = None
    watch = [sock, sys.stdin]
    while len(done) < qps_expected and (expected is None or packets < expected):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        if idle and last is not None:
            left = min(left, last + idle - time.monotonic())
            if left <= 0:
                break
        ready = select.select(watch, [], [], left)[0]
        if sys.stdin in ready:
            line = sys.stdin.readline()
            watch.remove(sys.stdin)
            if line.startswith("expect "):
                expected = int(line.split()[1])
                deadline = min(deadline, time.monotonic() + drain)
        if sock not in ready:
            continue
        try:
            data, anc, _, src = sock.recvmsg(65536, socket.CMSG_SPACE(4))
        except BlockingIOError:
            continue
        packets += 1
        last = time.monotonic()
        if first is None:
            first = last
        if len(data) < BTH_STRUCT.size:
            malformed += 1
            continue
        op, _, _, qpn, psn = BTH_STRUCT.unpack_from(data)
        tos = next((c[2][0] for c in anc if c[0] == socket.IPPROTO_IP and c[1] == IP_TOS_CMSG), 0)
        key = f"{src[0]}:{src[1]}/{qpn & 0xFFFFFF}"
        f = flows.setdefault(key, {"packets": 0, "bytes": 0, "out_of_order": 0, "ce": 0, "max_psn": -1})
        f["packets"] += 1
        f["bytes"] += len(data)
        psn &= 0xFFFFFF
        if psn < f["max_psn"]:
            f["out_of_order"] += 1
        else:
            f["max_psn"] = psn
        if tos & 3 == CE:
            f["ce"] += 1
        if op == WRITE_LAST:
            f["last_psn"] = psn
        # A QP is done once its last packet and every one before it came (spraying can deliver
        # the last before the others).
        if "last_psn" in f and f["packets"] >= f["last_psn"] + 1:
            done.add(key)
    return {"flows": flows, "complete": len(done), "malformed": malformed,
            "packets": sum(f["packets"] for f in flows.values()),
            "out_of_order": sum(f["out_of_order"] for f in flows.values()),
            "ce": sum(f["ce"] for f in flows.values()),
            "first_to_last_s": (last - first) if first is not None else 0.0}


IP_TOS_CMSG = socket.IP_TOS  # the cmsg type IP_RECVTOS delivers


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m emulator.tools.rocegen")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("send")
    s.add_argument("dst")
    s.add_argument("--qps", type=int, default=16)
    s.add_argument("--packets", type=int, default=100, help="per QP")
    s.add_argument("--payload", type=int, default=1024)
    s.add_argument("--pps", type=float, default=0.0)
    s.add_argument("--sport", choices=("pair", "qp"), default="qp")
    s.add_argument("--pair-id", type=int, default=0)
    s.add_argument("--burst", type=int, default=1, help="packets of one QP sent back to back")
    s.add_argument("--sndbuf", type=int, default=0, help="SO_SNDBUF bytes (small: block on a full NIC queue)")
    s.add_argument("--gate", action="store_true", help="print 'ready', then send when a line comes on stdin")
    f = sub.add_parser("flood", help="offer all the host takes, sendmmsg batches, for a time")
    f.add_argument("dst")
    f.add_argument("--qps", type=int, default=4)
    f.add_argument("--payload", type=int, default=64)
    f.add_argument("--seconds", type=float, default=2.0)
    f.add_argument("--batch", type=int, default=64, help="packets per sendmmsg call")
    f.add_argument("--pair-id", type=int, default=0)
    r = sub.add_parser("recv")
    r.add_argument("--qps", type=int, required=True, help="QPs (over all senders) to wait for")
    r.add_argument("--timeout", type=float, default=30.0)
    r.add_argument("--drain", type=float, default=2.0,
                   help="after an 'expect N' line on stdin, wait at most this long for the rest")
    r.add_argument("--idle", type=float, default=0.0, help="stop once nothing came for this long (0: never)")
    a = ap.parse_args(argv)
    if a.cmd == "send":
        out = send(a.dst, a.qps, a.packets, a.payload, a.pps, a.sport, a.pair_id, a.burst, a.sndbuf, a.gate)
    elif a.cmd == "flood":
        out = flood(a.dst, a.qps, a.payload, a.seconds, a.batch, a.pair_id)
    else:
        out = receive(a.qps, a.timeout, a.drain, a.idle)
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
