"""Aim random and mutated RoCEv2 packets at a soft-NIC while a transfer runs.

Run in the namespace of the host the transfer comes from (so the packets come from the QPs'
peer address and get past the source check to the deeper ones): it watches the transfer's
own packets leave on ``--dev`` and sends, paced at ``--pps``, ``--count`` packets of these
classes, and reports how many of each it sent:

- ``short``: fewer than 12 bytes of UDP payload (no whole BTH): the first switch drops these;
- ``random``: random bytes, 12 to 1024 of them;
- ``flipped``: a real packet (cut to at most 512 bytes, as all mutations but replays are) with 1-8 bits flipped outside the
  ICRC's masked byte, the ICRC left as it was: a packet corrupted in flight;
- ``forged``: a real packet's header made invalid (unknown opcode, transport version,
  destination QP that does not exist, pad count longer than the payload) with a correct ICRC;
- ``far_psn``: a real packet with its PSN moved far outside the receive window, correct ICRC;
- ``replay``: a real packet sent again later (an old PSN), correct ICRC.

Never forged: an in-window PSN with a valid ICRC under a known opcode. On a reliable connection
that packet is indistinguishable from the real one, for any NIC; it is not a malformed packet.

Prints one JSON line when done: ``{"sent": {class: n}, "seconds": s}``.
"""
from __future__ import annotations

import argparse
import json
import random
import socket
import sys
import time

from emulator.nic import wire
from emulator.nic.loop import IP_MTU_DISCOVER, IP_PMTUDISC_DO, QPN_BASE, SO_NO_CHECK

ETH_P_ALL, ETH_P_IP = 0x0003, 0x0800
CLASSES = ("short", "random", "flipped", "forged", "far_psn", "replay")
WEIGHTS = (5, 25, 25, 20, 15, 10)
SPORT = 50999  # the fuzzer's own UDP source port
CUT = 512  # payload bytes kept of a mutated real packet
QPNS = range(QPN_BASE, QPN_BASE + 4096)  # what soft-NICs number their QPs: never forged as "unknown"


def _sniffer(dev: str) -> socket.socket:
    # ETH_P_ALL: a socket bound to one protocol sees only what comes in, not what leaves.
    s = socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, socket.htons(ETH_P_ALL))
    s.bind((dev, ETH_P_ALL))
    s.setblocking(False)
    return s


def _transport(ip_packet: bytes, dst: str) -> bytes | None:
    """The BTH..ICRC of a RoCEv2 datagram to ``dst`` (an IPv4 packet), else None."""
    if len(ip_packet) < 28 or ip_packet[9] != 17 or socket.inet_ntoa(ip_packet[16:20]) != dst:
        return None
    ihl = (ip_packet[0] & 0xF) * 4
    if int.from_bytes(ip_packet[ihl + 2:ihl + 4], "big") != wire.ROCE_PORT:
        return None
    if int.from_bytes(ip_packet[ihl:ihl + 2], "big") == SPORT:
        return None  # our own: mutating a mutation could forge an in-window packet
    return ip_packet[ihl + 8:]


def _with_icrc(src: str, dst: str, body: bytes) -> bytes:
    ip, udp = wire.ipv4_udp_headers(src, dst, SPORT, len(body) + wire.ICRC_LEN)
    return body + wire.icrc(ip, udp, body)


def mutate(kind: str, real: bytes, src: str, dst: str, qpns: range, rng: random.Random) -> bytes:
    if kind == "short":
        return rng.randbytes(rng.randrange(0, 12))
    if kind == "random":
        return rng.randbytes(rng.randrange(12, 1025))
    if kind == "flipped":
        out = bytearray(real[:min(len(real), CUT)])
        body = len(out) - wire.ICRC_LEN if len(out) == len(real) else len(out)
        for _ in range(rng.randrange(1, 9)):
            # Headers more often than payload; never byte 4 (FECN/BECN: masked, not covered).
            i = rng.randrange(min(body, 64) if rng.random() < 0.5 else body - 1)
            i += i >= 4
            out[i] ^= 1 << rng.randrange(8)
        return bytes(out)
    body = bytearray(real[:-wire.ICRC_LEN])
    if kind == "replay":
        return _with_icrc(src, dst, bytes(body))
    body = body[:wire.BTH_LEN + wire.RETH_LEN + CUT]  # small: the fuzz must not crowd the transfer off the link
    if kind == "far_psn":
        psn = int.from_bytes(body[9:12], "big")
        far = rng.choice((1, -1)) * rng.randrange(1 << 20, (1 << 23) - 1)
        body[9:12] = ((psn + far) % wire.PSN_MOD).to_bytes(3, "big")
        return _with_icrc(src, dst, bytes(body))
    # forged
    how = rng.choice(("opcode", "tver", "qpn", "padding"))
    if how == "opcode":
        body[0] = rng.choice([op for op in range(256) if op not in wire.OPCODE_NAMES])
    elif how == "tver":
        body[1] = (body[1] & 0xF0) | rng.randrange(1, 16)
    elif how == "qpn":
        qpn = rng.randrange(1 << 24)
        while qpn in qpns:
            qpn = rng.randrange(1 << 24)
        body[5:8] = qpn.to_bytes(3, "big")
    else:  # a bare BTH whose pad count is longer than the (empty) payload
        body = body[:wire.BTH_LEN]
        body[0] = wire.SEND_ONLY
        body[1] |= 3 << 4
    return _with_icrc(src, dst, bytes(body))


def run(src: str, dst: str, dev: str, count: int, pps: float, seed: int, qpns: range = QPNS,
        warmup: int = 64, timeout: float = 120.0) -> dict:
    rng = random.Random(seed)
    sniff = _sniffer(dev)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx.setsockopt(socket.SOL_SOCKET, SO_NO_CHECK, 1)  # UDP checksum 0, as RoCEv2
    tx.setsockopt(socket.IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_DO)  # DF set, so IP ID 0
    tx.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)  # block rather than flood the host's queue
    tx.bind((src, SPORT))
    seen: list[bytes] = []
    sent = {k: 0 for k in CLASSES}
    deadline = time.monotonic() + timeout

    def watch() -> None:
        while True:
            try:
                pkt, addr = sniff.recvfrom(65535)
            except BlockingIOError:
                return
            if addr[1] != ETH_P_IP:
                continue
            t = _transport(pkt, dst)
            if t is not None and len(t) > wire.BTH_LEN + wire.ICRC_LEN and t[0] <= wire.WRITE_ONLY_IMM:
                if len(seen) < 4096:
                    seen.append(t)
                else:
                    seen[rng.randrange(len(seen))] = t

    while len(seen) < warmup:
        if time.monotonic() > deadline:
            raise SystemExit(f"saw only {len(seen)} RoCEv2 packets to {dst} on {dev}: is a transfer running?")
        watch()
        time.sleep(0.001)
    started = time.monotonic()
    for i in range(count):
        watch()
        kind = rng.choices(CLASSES, WEIGHTS)[0]
        real = rng.choice(seen)
        tx.sendto(mutate(kind, real, src, dst, qpns, rng), (dst, wire.ROCE_PORT))
        sent[kind] += 1
        wait = started + (i + 1) / pps - time.monotonic()
        if wait > 0:
            time.sleep(wait)
    return {"sent": sent, "seconds": time.monotonic() - started}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m emulator.tools.fuzz", description=__doc__.splitlines()[0])
    ap.add_argument("--src", required=True, help="this host's address (the QPs' peer)")
    ap.add_argument("--dst", required=True, help="the target NIC's address")
    ap.add_argument("--dev", default="eth0")
    ap.add_argument("--count", type=int, default=100_000)
    ap.add_argument("--pps", type=float, default=10_000)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args(argv)
    print(json.dumps(run(a.src, a.dst, a.dev, a.count, a.pps, a.seed)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
