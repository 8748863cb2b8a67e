"""The soft-NIC's socket loop: UDP 4791 in, many QPs out, paced at the line rate.

One process per host namespace runs one ``SoftNic``. Receiving: one socket bound to port 4791
takes every RoCEv2 packet; each is ICRC-checked (the IPv4 and UDP headers it covers are rebuilt
from the datagram's source and length: Linux sends DF datagrams from unconnected sockets with IP
ID 0, and TOS, TTL and checksums are masked), parsed, and handed to its QP after the QPN and the
peer's address are checked. Everything refused is counted by reason; no packet can raise out of
the loop. Sending: each QP has its own socket bound to its own UDP source port (the entropy the
switches hash), sending ECT(0) with DF. A token bucket at the host link's rate stands in for
the NIC's serialiser, so the host's small egress queue is never overrun; ``QueuePair.pace`` is
the per-QP hook DCQCN drives.

No asyncio: a select() per idle period and plain non-blocking reads in batches (asyncio costs
about 8x per datagram here); payloads go out by scatter-gather sendmsg straight from the
registered buffer, with no copy in Python. No UDP GSO either: Linux refuses a UDP_SEGMENT send
on a socket that sends checksum 0 (EINVAL: segmentation needs checksum offload), and RoCEv2
sends checksum 0; Python has no sendmmsg. So each packet is one sendmsg, and the loop sends a
QP's packets back to back between reads.
"""
from __future__ import annotations

import select
import socket
import struct
import time
from dataclasses import dataclass, field

from . import dcqcn, wire
from .memory import ProtectionDomain
from .rc import CompletionQueue, QpConfig, QueuePair

SO_NO_CHECK = 11  # RoCEv2 sends UDP checksum 0
IP_MTU_DISCOVER, IP_PMTUDISC_DO = 10, 2  # DF on every datagram (and so IP ID 0 when unconnected)
IP_RECVTOS = 13
SO_RCVBUFFORCE = 33  # root may exceed net.core.rmem_max (Python does not name it)
SO_RXQ_OVFL = 40  # the kernel tells us how many datagrams it dropped on a full receive buffer
SO_TIMESTAMPNS = 35  # each datagram's arrival time: the NP spaces CNPs by when packets arrived,
_TIMESPEC = struct.Struct("=qq")  # not by when a busy loop got round to reading them
DSCP_DATA = 26
DSCP_CNP = 48  # CNPs go out non-ECT with DSCP 48, as NICs send them
ECT0, CE = 0b10, 0b11
SPORT_BASE = 49152  # RoCEv2 source ports come from the dynamic range
QPN_BASE = 0x100
RX_BATCH = 128  # datagrams read per turn before anything is sent
TX_BATCH = 16  # packets per QP per turn: keeps QPs interleaved on the wire
TX_TURN_S = 0.5e-3  # sending stops after this long in a turn, so ACKs and CNPs are read: a
                    # CPU-bound loop (a guest under software emulation) once sent for 0.5 s
                    # while its ACKs and CNPs waited, inflating srtt 10x and delaying every cut
RCVBUF = 32 << 20
WIRE_OVERHEAD = 14 + 20 + 8  # Ethernet, IPv4, UDP: what the host link carries besides the transport
_ICRC = struct.Struct("<I")
_CMSG = 2 * socket.CMSG_SPACE(4) + socket.CMSG_SPACE(_TIMESPEC.size)


@dataclass
class NicCounters:
    rx_packets: int = 0
    tx_packets: int = 0
    rx_ce: int = 0
    socket_overflow: int = 0  # datagrams the kernel dropped before the NIC could read them
    dropped: dict[str, int] = field(default_factory=dict)  # reason -> packets refused before any QP

    def drop(self, reason: str) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + 1


class SoftNic:
    def __init__(self, ip: str, line_rate_bps: float = 0.0, burst_bytes: int = 64 << 10,
                 clock=time.monotonic, cc: dcqcn.Profile | None = None) -> None:
        self.ip = ip
        # DCQCN: with a profile (already scaled), each QP gets a reaction point and pacer for
        # what it sends and a notification point for what it receives.
        self.cc = cc if cc is not None and cc.enabled else None
        self._np: dict[int, dcqcn.NotificationPoint] = {}
        self.pd = ProtectionDomain()
        self.clock = clock
        self.counters = NicCounters()
        self.qps: dict[int, QueuePair] = {}
        self._peer: dict[int, tuple[str, socket.socket, int]] = {}  # qpn -> (peer ip, socket, sport)
        self._rate = line_rate_bps / 8  # bytes per second; 0: unpaced
        self._burst = burst_bytes
        self._tokens = float(burst_bytes)
        self._refilled = clock()
        self._crc_cache: dict[tuple, int] = {}
        self._rr = 0
        self.tx_bytes: dict[int, int] = {}  # qpn -> bytes this QP put on the host link
        self.ce_data: dict[int, int] = {}  # qpn -> CE-marked data packets it received
        self.cnp_delays: list[float] = []  # s from a marked packet's arrival to its CNP's send
        self.cnp_reactions: list[float] = []  # s from a CNP's arrival to the rate cut it caused
        self.rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.rx.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE if _root() else socket.SO_RCVBUF, RCVBUF)
        self.rx.setsockopt(socket.IPPROTO_IP, IP_RECVTOS, 1)
        self.rx.setsockopt(socket.SOL_SOCKET, SO_RXQ_OVFL, 1)
        self.rx.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        self.rx.bind((ip, wire.ROCE_PORT))
        self.rx.setblocking(False)
        self._rxbuf = bytearray(65536)
        self._rxview = memoryview(self._rxbuf)

    def close(self) -> None:
        for _, sock, _ in self._peer.values():
            sock.close()
        self.rx.close()

    # --- verbs ---

    def create_qp(self, peer_ip: str, config: QpConfig | None = None, send_cq: CompletionQueue | None = None,
                  recv_cq: CompletionQueue | None = None, initial_psn: int = 0) -> QueuePair:
        qpn = QPN_BASE + len(self.qps)
        qp = QueuePair(qpn, self.pd, send_cq or CompletionQueue(), recv_cq or CompletionQueue(), config,
                       initial_psn)
        sport = SPORT_BASE + qpn % 16384
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.setsockopt(socket.SOL_SOCKET, SO_NO_CHECK, 1)
        s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, (DSCP_DATA << 2) | ECT0)
        s.setsockopt(socket.IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_DO)
        s.bind((self.ip, sport))
        self.qps[qpn] = qp
        self._peer[qpn] = (peer_ip, s, sport)
        self.tx_bytes[qpn] = 0
        self.ce_data[qpn] = 0
        if self.cc is not None:
            qp.rp = dcqcn.ReactionPoint(self.cc, self._rate * 8 or 1e12, self.clock())
            qp.pace = dcqcn.RatePacer(qp.rp, 2 * (4096 + 100))
            self._np[qpn] = dcqcn.NotificationPoint(self.cc)
        return qp

    # --- the loop ---

    def _icrc_prefix(self, src: str, dst: str, sport: int, tlen: int) -> int:
        key = (src, dst, sport, tlen)
        crc = self._crc_cache.get(key)
        if crc is None:
            if len(self._crc_cache) > 4096:  # random sources (a fuzzer) must not grow it forever
                self._crc_cache.clear()
            crc = self._crc_cache[key] = wire.icrc_headers(*wire.ipv4_udp_headers(src, dst, sport, tlen))
        return crc

    def _icrc(self, peer: str, sport: int, parts) -> bytes:
        """The ICRC of a packet (headers, payload, pad) we send to ``peer`` from ``sport``."""
        tlen = sum(len(p) for p in parts) + wire.ICRC_LEN
        return _ICRC.pack(wire.icrc_transport(self._icrc_prefix(self.ip, peer, sport, tlen), parts))

    def _send(self, qpn: int, parts) -> int:
        peer, sock, sport = self._peer[qpn]
        icrc = self._icrc(peer, sport, parts)
        sock.sendmsg([*parts, icrc], [], 0, (peer, wire.ROCE_PORT))
        self.counters.tx_packets += 1
        n = sum(len(p) for p in parts) + wire.ICRC_LEN + WIRE_OVERHEAD
        self.tx_bytes[qpn] += n
        return n

    def _send_cnp(self, qp) -> None:
        """A congestion notification to the QP's peer: BECN set, non-ECT, DSCP 48."""
        peer, sock, sport = self._peer[qp.qpn]
        body = wire.build(wire.Bth(wire.CNP, qp.dqpn, 0, becn=True))
        tos = struct.pack("=i", DSCP_CNP << 2)
        sock.sendmsg([body, self._icrc(peer, sport, [body])], [(socket.IPPROTO_IP, socket.IP_TOS, tos)], 0,
                     (peer, wire.ROCE_PORT))
        qp.stats.cnps_sent += 1
        self.counters.tx_packets += 1

    def _receive(self, now: float) -> int:
        n_got = 0
        view = self._rxview
        c = self.counters
        for _ in range(RX_BATCH):
            try:
                n, anc, _, addr = self.rx.recvmsg_into([self._rxbuf], _CMSG)
            except BlockingIOError:
                break
            n_got += 1
            c.rx_packets += 1
            try:
                self._input(view[:n], addr, anc, now)
            except wire.Malformed as e:
                c.drop(e.reason)
            except Exception:  # a bug must cost one packet, never the NIC: counted, and tests assert none
                c.drop("internal_error")
        return n_got

    def _input(self, data: memoryview, addr: tuple, anc: list, now: float) -> None:
        ce = False
        arrived = None  # kernel arrival time (CLOCK_REALTIME): only differences are used
        for level, kind, value in anc:
            if level == socket.IPPROTO_IP and kind == socket.IP_TOS and value and value[0] & 3 == CE:
                self.counters.rx_ce += 1
                ce = True
            elif level == socket.SOL_SOCKET and kind == SO_RXQ_OVFL and len(value) >= 4:
                self.counters.socket_overflow = struct.unpack("=I", value[:4])[0]
            elif level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(value) >= _TIMESPEC.size:
                sec, nsec = _TIMESPEC.unpack(value[:_TIMESPEC.size])
                arrived = sec + nsec * 1e-9
        n = len(data)
        if n < wire.BTH_LEN + wire.ICRC_LEN:
            raise wire.Malformed("truncated", f"{n} bytes")
        src, sport = addr[0], addr[1]
        crc = wire.icrc_transport(self._icrc_prefix(src, self.ip, sport, n), [data[:n - 4]])
        if _ICRC.pack(crc) != data[n - 4:n]:
            raise wire.Malformed("bad_icrc")
        pkt = wire.parse(data)
        qp = self.qps.get(pkt.bth.dqpn)
        if qp is None:
            raise wire.Malformed("unknown_qp", hex(pkt.bth.dqpn))
        if src != self._peer[qp.qpn][0] or not qp.connected:
            raise wire.Malformed("wrong_source", src)  # RC: only the connected peer may talk to a QP
        qp.receive(pkt, now)
        if pkt.bth.opcode == wire.CNP and arrived is not None:  # the sender's share of the feedback delay
            self.cnp_reactions.append(time.time() - arrived)
        if ce and pkt.bth.opcode <= wire.WRITE_ONLY_IMM:
            self.ce_data[qp.qpn] += 1
            if qp.qpn in self._np and self._np[qp.qpn].on_ce(now if arrived is None else arrived):
                self._send_cnp(qp)
                if arrived is not None:  # how late the answer left: the loop's share of the feedback delay
                    self.cnp_delays.append(time.time() - arrived)
        if qp.outbox:  # answer at once: an ACK held back behind a batch looks like loss to the peer
            for parts in qp.outbox:
                self._tokens -= self._send(qp.qpn, parts)
            qp.outbox.clear()

    def _refill(self, now: float) -> None:
        if self._rate:
            self._tokens = min(self._burst, self._tokens + (now - self._refilled) * self._rate)
        self._refilled = now

    def step(self, max_wait: float = 0.05) -> None:
        """One turn: read what has come, send what may go, fire timers, or sleep until one of
        those can happen (at most ``max_wait``)."""
        now = self.clock()
        got = self._receive(now)
        self._refill(now)
        sent = 0
        for qpn, qp in self.qps.items():
            if qp.outbox:
                for parts in qp.outbox:
                    self._tokens -= self._send(qpn, parts)
                qp.outbox.clear()
        # Data, round robin over QPs while the line has tokens; each turn starts one QP further
        # on, so no QP has the first claim on the line.
        order = list(self.qps.items())
        if order:
            self._rr = (self._rr + 1) % len(order)
            order = order[self._rr:] + order[:self._rr]
        more = True
        turn_end = self.clock() + TX_TURN_S  # from when sending starts: reading took its own time
        while more and (not self._rate or self._tokens > 0):
            more = False
            for qpn, qp in order:
                if self._rate and self._tokens <= 0:
                    break
                budget = TX_BATCH if not self._rate else max(1, min(TX_BATCH, int(self._tokens // 4200) + 1))
                pkts = qp.transmit(now, budget)
                for parts in pkts:
                    self._tokens -= self._send(qpn, parts)
                sent += len(pkts)
                more |= len(pkts) == budget
                if pkts and self.clock() >= turn_end:
                    more = False  # read what came in meanwhile; the next turn goes on sending
                    break
            now = self.clock()
            if self._rate:
                self._refill(now)
        for qp in self.qps.values():
            if qp.deadline is not None and qp.deadline <= now:
                qp.on_timer(now)
        if got or sent:
            return
        # Idle: sleep until a packet comes, the line has tokens again, or a timer is due.
        wait = max_wait
        for qp in self.qps.values():
            if qp.deadline is not None:
                wait = min(wait, qp.deadline - now)
            if self._rate and self._tokens <= 0 and qp.nxt < qp.end:
                wait = min(wait, -self._tokens / self._rate)
            if isinstance(qp.pace, dcqcn.RatePacer) and qp.nxt < qp.end:
                paced = qp.pace.wait(now)
                if paced > 0:
                    wait = min(wait, paced)
        if wait > 0:
            select.select([self.rx], [], [], wait)

    def run(self, done, timeout: float, max_wait: float = 0.05) -> bool:
        """Turn until ``done()``; False if ``timeout`` seconds passed first. ``done`` is asked
        at least every ``max_wait`` seconds."""
        end = self.clock() + timeout
        while not done():
            if self.clock() > end:
                return False
            self.step(max_wait)
        return True

    def qp_state(self, qpn: int) -> tuple[float, float, float, float, int, int, int, int]:
        """(bits the rate allowed since the start, rate, target rate, alpha, CNPs received,
        CNPs sent, CE-marked packets received, bytes sent) of one QP now; without DCQCN the
        rate is the line's and alpha 0."""
        qp = self.qps[qpn]
        rp = qp.rp
        now = self.clock()
        line = self._rate * 8
        allowed = rp.allowed_bits(now) if rp else line * now
        return (allowed, rp.rc if rp else line, rp.rt if rp else line, rp.alpha if rp else 0.0,
                qp.stats.cnps_received, qp.stats.cnps_sent, self.ce_data[qpn], self.tx_bytes[qpn])

    def stats(self) -> dict:
        return {"rx_packets": self.counters.rx_packets, "tx_packets": self.counters.tx_packets,
                "rx_ce": self.counters.rx_ce, "socket_overflow": self.counters.socket_overflow,
                "dropped": dict(self.counters.dropped), "cnp_delay_s": _summary(self.cnp_delays),
                "cnp_reaction_s": _summary(self.cnp_reactions)}


def _summary(xs: list[float]) -> dict | None:
    if not xs:
        return None
    s = sorted(xs)
    return {"count": len(s), "p50": s[len(s) // 2], "p90": s[int(len(s) * 0.9)], "max": s[-1]}


def _root() -> bool:
    import os

    return os.geteuid() == 0
