"""A simulated link and clock for driving two RC queue pairs without sockets: the unit tests'
fake network, and the transport benchmark's (bench/transport.py) 3,000 km path.

Every packet is framed as it would be on the wire (IPv4 and UDP headers, ICRC) and parsed back
with the ICRC checked, so the state machines only ever see what a real peer could send. The
link has a one-way delay and a serialisation time per packet; a ``fate`` function decides, per
transmission, whether a packet is dropped, duplicated or held back (reordered).
"""
from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import Callable

from emulator.nic import wire
from emulator.nic.memory import ProtectionDomain
from emulator.nic.rc import CompletionQueue, QpConfig, QueuePair

A_IP, B_IP = "198.18.0.2", "198.18.1.2"
DROP, DUP, LATE = "drop", "dup", "late"


def frame(src: str, dst: str, sport: int, parts) -> tuple[bytes, bytes, bytes]:
    """(IP header, UDP header, transport with ICRC) for one packet the QP produced."""
    body = b"".join(bytes(p) for p in parts)
    ip, udp = wire.ipv4_udp_headers(src, dst, sport, len(body) + wire.ICRC_LEN)
    return ip, udp, body + wire.icrc(ip, udp, body)


def deliver(qp: QueuePair, ip: bytes, udp: bytes, transport: bytes, now: float) -> None:
    """Hand a packet to a QP as the NIC's loop does: a plain WRITE the QP expects is carried
    out on the spot (QueuePair.write_next), anything else parsed (ICRC checked) and received."""
    plain = wire.plain_write(memoryview(transport))
    if plain is None or not qp.write_next(*plain[1:]):
        qp.receive(wire.parse(transport, ip, udp), now)


@dataclass
class Side:
    name: str
    ip: str
    qp: QueuePair
    pd: ProtectionDomain
    scq: CompletionQueue
    rcq: CompletionQueue


@dataclass
class Net:
    a: Side
    b: Side
    delay: float = 0.001  # one way, s
    pkt_time: float = 1e-6  # serialisation per packet, s
    fate: Callable[[str, int, bytes], str | None] = lambda direction, index, transport: None
    now: float = 0.0
    sent: dict[str, int] = field(default_factory=lambda: {"a>b": 0, "b>a": 0})
    _q: list = field(default_factory=list)
    _free: dict[str, float] = field(default_factory=lambda: {"a>b": 0.0, "b>a": 0.0})
    _tie: itertools.count = field(default_factory=itertools.count)

    def _put(self, direction: str, parts) -> None:
        src, dst = (self.a, self.b) if direction == "a>b" else (self.b, self.a)
        ip, udp, transport = frame(src.ip, dst.ip, 49152, parts)
        index = self.sent[direction]
        self.sent[direction] += 1
        fate = self.fate(direction, index, transport)
        if fate == DROP:
            return
        self._free[direction] = max(self._free[direction], self.now) + self.pkt_time
        at = self._free[direction] + self.delay
        copies = 2 if fate == DUP else 1
        if fate == LATE:
            at += 20 * self.pkt_time + self.delay / 4  # overtaken by what follows
        for _ in range(copies):
            heapq.heappush(self._q, (at, next(self._tie), dst, ip, udp, transport))

    def _pump(self, budget: int = 64) -> None:
        for side, direction in ((self.a, "a>b"), (self.b, "b>a")):
            qp = side.qp
            for parts in qp.outbox:
                self._put(direction, parts)
            qp.outbox.clear()
            for parts in qp.transmit(self.now, budget):
                self._put(direction, parts)

    def run(self, until: Callable[[], bool], max_time: float = 60.0) -> None:
        """Advance the fake clock event by event until ``until()`` or ``max_time``."""
        while not until():
            self._pump()
            events = [t for t in (self.a.qp.deadline, self.b.qp.deadline) if t is not None]
            if self._q:
                events.append(self._q[0][0])
            if not events:
                self._pump()
                if until() or (not self._q and self.a.qp.deadline is None and self.b.qp.deadline is None):
                    return
                continue
            self.now = max(self.now, min(events))
            if self.now > max_time:
                raise TimeoutError(f"fake clock passed {max_time} s")
            while self._q and self._q[0][0] <= self.now:
                _, _, dst, ip, udp, transport = heapq.heappop(self._q)
                deliver(dst.qp, ip, udp, transport, self.now)
            for side in (self.a, self.b):
                side.qp.on_timer(self.now)


def pair(mode: str = "selective", a_psn: int = 0, b_psn: int = 0, b_mode: str | None = None,
         **cfg) -> tuple[Side, Side]:
    """Two connected QPs; ``b_mode`` (default: ``mode``) lets B be a standard peer. Each side
    offers its mode and uses selective repeat only if the other offered it too."""
    sides = []
    for name, ip, qpn, psn, m in (("a", A_IP, 0x11, a_psn, mode), ("b", B_IP, 0x22, b_psn, b_mode or mode)):
        pd = ProtectionDomain()
        scq, rcq = CompletionQueue(), CompletionQueue()
        qp = QueuePair(qpn, pd, scq, rcq, QpConfig(mode=m, **cfg), initial_psn=psn)
        sides.append(Side(name, ip, qp, pd, scq, rcq))
    a, b = sides
    a.qp.connect(b.qp.qpn, b.qp.ipsn, sack=b.qp.offers_sack)
    b.qp.connect(a.qp.qpn, a.qp.ipsn, sack=a.qp.offers_sack)
    return a, b
