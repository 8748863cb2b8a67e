"""A raw UDP blaster and counter: the baseline instrument for link rates.

Run inside a node's namespace (``python -m emulator.tools.blast send|recv ...``). The sender uses a
blocking socket with a send buffer of two frames, so the egress qdisc paces it: it cannot run
ahead of the shaper, and the queue never overflows because of the instrument itself. The
receiver prints ``ready`` once bound (the caller waits for that line, not for a timer), counts
what arrives in a window after a warm-up, and prints one JSON line.
"""
from __future__ import annotations

import argparse
import json
import os
import select
import socket
import sys
import time

UDP_IP_ETH = 8 + 20 + 14  # header bytes a shaper counts on top of the UDP payload
# The socket option that stamps each datagram with the socket's drop count (asm-generic/socket.h).
SO_RXQ_OVFL = getattr(socket, "SO_RXQ_OVFL", 40)


def _wait_for_go(sock: socket.socket) -> dict | None:
    """Until a packet or a line on standard input comes (the caller's word that its sender is
    sending): an error record if standard input closed first."""
    ready, _, _ = select.select([sock, sys.stdin], [], [])
    if sock not in ready and not sys.stdin.readline():
        return {"error": "told nothing: standard input closed before the sender started"}
    return None


def receive(bind: str, port: int, warmup: float, seconds: float, first_timeout: float, go: bool = False) -> dict:
    """Measure the rate of what arrives after the first packet. With ``go`` the first packet's
    wait of ``first_timeout`` starts when a line comes on standard input (the caller's word that
    its sender is sending), not at once: a sender's start-up on a slow machine is not the path's
    silence."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    sock.bind((bind, port))
    print("ready", flush=True)
    buf = bytearray(65536)
    failed = _wait_for_go(sock) if go else None
    if failed:
        return failed
    sock.settimeout(first_timeout)
    try:
        n = sock.recv_into(buf)
    except socket.timeout:
        return {"error": f"no packet within {first_timeout} s"}
    first = time.monotonic()
    start, end = first + warmup, first + warmup + seconds
    packets = payload = 0
    last = None
    sock.settimeout(0.5)
    while True:
        try:
            n = sock.recv_into(buf)
        except socket.timeout:
            break
        now = time.monotonic()
        if now >= end:
            break
        if now >= start:
            packets += 1
            payload += n
            last = now
    if not packets or last is None:
        return {"error": "nothing arrived after the warm-up"}
    size = payload / packets
    return {
        "packets": packets,
        "payload_bytes": payload,
        "seconds": seconds,
        "payload_bps": payload * 8 / seconds,
        "wire_bps": packets * (size + UDP_IP_ETH) * 8 / seconds,
    }


def _big_receive_buffer(sock: socket.socket, size: int) -> None:
    """``size`` bytes of receive buffer: as root past net.core.rmem_max (this socket only, the
    sysctl untouched), so a receiver the machine holds up for a while loses nothing."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUFFORCE, size)
    except (OSError, AttributeError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, size)


def count(bind: str, port: int, expect: int, idle: float, first_timeout: float, idle_after_eof: bool = False,
          go: bool = False) -> dict:
    """Count every packet until ``expect`` arrived or none came for ``idle`` seconds (with
    ``idle_after_eof``: none came for ``idle`` seconds after standard input closed, which the
    caller does once its sender has finished). Also what the socket itself dropped, full (the
    kernel's count, SO_RXQ_OVFL): a loss of the instrument's, never of the path's."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    _big_receive_buffer(sock, 16 << 20)
    sock.setsockopt(socket.SOL_SOCKET, SO_RXQ_OVFL, 1)
    sock.bind((bind, port))
    print("ready", flush=True)
    buf = bytearray(65536)
    dropped = 0
    failed = _wait_for_go(sock) if go else None  # as in receive()
    if failed:
        return failed

    def take() -> None:
        nonlocal dropped
        _, ancillary, _, _ = sock.recvmsg_into([buf], socket.CMSG_SPACE(4))
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == SO_RXQ_OVFL and len(data) >= 4:
                dropped = max(dropped, int.from_bytes(data[:4], sys.byteorder))

    sock.settimeout(first_timeout)
    try:
        take()
    except socket.timeout:
        return {"error": f"no packet within {first_timeout} s"}
    packets = 1
    sender_done = not idle_after_eof
    sock.settimeout(None)
    while packets < expect:
        ready, _, _ = select.select([sock] + ([] if sender_done else [sys.stdin]), [], [], idle)
        if sock in ready:
            take()
            packets += 1
        elif not sender_done and ready:
            if not sys.stdin.readline():
                sender_done = True
        elif sender_done:
            break
    return {"packets": packets, "socket_drops": dropped}


def _realtime() -> bool:
    """Run at real-time priority: with a queue of a few frames, a sender descheduled for a
    millisecond by an ordinary process would leave the port idle and under-measure it. The
    sender blocks on its send buffer between frames, so it never hogs a core."""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
        return True
    except (OSError, AttributeError):
        return False


def send(dst: str, port: int, size: int, seconds: float) -> dict:
    realtime = _realtime()
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 2 * (size + UDP_IP_ETH))
    payload = bytes(size)
    print("sending", flush=True)  # for a receiver that waits for the word (recv --go)
    end = time.monotonic() + seconds
    sent = 0
    while time.monotonic() < end:
        for _ in range(16):
            try:
                sock.sendto(payload, (dst, port))
                sent += 1
            except OSError:
                pass  # ENOBUFS/ECONNREFUSED: counted at the receiver, which is what we measure
    return {"sent_packets": sent, "realtime": realtime}


def send_count(dst: str, port: int, size: int, total: int, pps: float) -> dict:
    """Send exactly ``total`` packets at ``pps`` per second (a paced trickle, not a blast).
    Late (the machine held the process up) it goes on from now: catching up in a burst would
    overflow the queues on the way and count the instrument's own drops as the path's."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    payload = bytes(size)
    print("sending", flush=True)  # for a receiver that waits for the word (recv --go)
    start = due = time.monotonic()
    sent = failed = 0
    for _ in range(total):
        wait = due - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        due = max(due, time.monotonic()) + 1 / pps
        try:
            sock.sendto(payload, (dst, port))
            sent += 1
        except OSError:
            failed += 1  # never reached the wire: not the path's loss, so not counted as sent
    return {"sent_packets": sent, "send_errors": failed, "seconds": time.monotonic() - start}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m emulator.tools.blast")
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("recv")
    r.add_argument("--bind", required=True)
    r.add_argument("--port", type=int, default=47001)
    r.add_argument("--warmup", type=float, default=0.3)
    r.add_argument("--seconds", type=float, default=1.0)
    r.add_argument("--first-timeout", type=float, default=5.0)
    r.add_argument("--go", action="store_true",
                   help="Start the first packet's wait when a line comes on standard input.")
    r.add_argument("--count", type=int, default=0, help="Count every packet until this many arrived ...")
    r.add_argument("--idle", type=float, default=2.0, help="... or none came for this long.")
    r.add_argument("--idle-after-eof", action="store_true",
                   help="Start the idle clock only once standard input is closed (the sender finished).")
    s = sub.add_parser("send")
    s.add_argument("--dst", required=True)
    s.add_argument("--port", type=int, default=47001)
    s.add_argument("--size", type=int, default=4000)
    s.add_argument("--seconds", type=float, default=1.5)
    s.add_argument("--count", type=int, default=0, help="Send exactly this many packets ...")
    s.add_argument("--pps", type=float, default=1000.0, help="... at this many per second.")
    a = ap.parse_args(argv)
    if a.cmd == "recv" and a.count:
        out = count(a.bind, a.port, a.count, a.idle, a.first_timeout, a.idle_after_eof, a.go)
    elif a.cmd == "recv":
        out = receive(a.bind, a.port, a.warmup, a.seconds, a.first_timeout, a.go)
    elif a.count:
        out = send_count(a.dst, a.port, a.size, a.count, a.pps)
    else:
        out = send(a.dst, a.port, a.size, a.seconds)
    print(json.dumps(out), flush=True)
    return 1 if "error" in out else 0


if __name__ == "__main__":
    sys.exit(main())
