"""The soft-NIC's socket loop: UDP 4791 in, many QPs out, paced at the line rate.

One process per host namespace runs one ``SoftNic``. Receiving: a raw IPv4 socket for UDP,
bound to the NIC's address, with a classic BPF filter that passes only datagrams to port 4791,
takes every RoCEv2 packet with the IP and UDP headers it arrived with. The ICRC covers those
headers (IP ID and flags included: a kernel peer such as rdma_rxe sends non-zero IDs), so
nothing is rebuilt; it is checked, the packet parsed and handed to its QP after the QPN and the
peer's address are checked. Everything refused is counted by reason; no packet can raise out of
the loop. A UDP socket stays bound to port 4791 so that the kernel does not answer every packet
with ICMP "port unreachable"; its filter drops what it gets (counted as Udp InErrors, never as
RcvbufErrors, which the fidelity monitor reads). Sending: each QP has its own socket bound to its own UDP source port (the entropy the
switches hash), sending ECT(0) with DF. A token bucket at the host link's rate stands in for
the NIC's serialiser, so the host's small egress queue is never overrun; ``QueuePair.pace`` is
the per-QP hook DCQCN drives.

Time: the loop's protocol clock is virtual, wall time / ``dilation`` (emulator/model/timemodel.py), so
RTOs, RTT samples, DCQCN's timers and CNP spacing, and pacing all run in the real fabric's
units, and the loop's own millisecond of lag counts as d times less against them. Rates are
emulated bytes per virtual second (the real rate x scale x dilation) and bytes are emulated
bytes (real x scale x dilation): at d = 1/scale both are the real fabric's. What the loop
itself needs in wall time (how long a turn sends, how long it may sleep) stays in wall time.

No asyncio: a select() per idle period and non-blocking reads of up to RX_BATCH datagrams in
one recvmmsg(2) (nic/mmsg.py; asyncio costs about 8x per datagram here). A WRITE_MIDDLE or
WRITE_LAST that its QP expects is carried out without building a parsed Packet
(QueuePair.write_next). Payloads go out by scatter-gather sendmsg straight from the
registered buffer, with no copy in Python. No UDP GSO either: Linux refuses a UDP_SEGMENT send
on a socket that sends checksum 0 (EINVAL: segmentation needs checksum offload), and RoCEv2
sends checksum 0; Python has no sendmmsg. So each packet is one sendmsg, and the loop sends a
QP's packets back to back between reads.
"""
from __future__ import annotations

import collections
import errno
import heapq
import select
import socket
import struct
import time
from dataclasses import asdict, dataclass, field

from emulator.nic import dcqcn, mmsg, wire
from emulator.nic.memory import ProtectionDomain
from emulator.nic.rc import CompletionQueue, QpConfig, QueuePair
from emulator.nic.wire import CE, DSCP_CNP, DSCP_DATA, ECT0, crc32
from emulator.stats import summary

SO_NO_CHECK = 11  # RoCEv2 sends UDP checksum 0
IP_MTU_DISCOVER, IP_PMTUDISC_DO = 10, 2  # DF on every datagram (and so IP ID 0 when unconnected)
SO_ATTACH_FILTER = 26  # a classic BPF filter on a socket (Python does not name it)
SO_RCVBUFFORCE = 33  # root may exceed net.core.rmem_max (Python does not name it)
SO_RXQ_OVFL = 40  # the kernel tells us how many datagrams it dropped on a full receive buffer
SO_TIMESTAMPNS = 35  # each datagram's arrival time: the NP spaces CNPs by when packets arrived,
_TIMESPEC = struct.Struct("=qq")  # not by when a busy loop got round to reading them
SPORT_BASE = 49152  # RoCEv2 source ports come from the dynamic range
QPN_BASE = 0x100
RX_BATCH = 128  # datagrams read per turn before anything is sent
TX_BATCH = 16  # packets per QP per turn: keeps QPs interleaved on the wire
TX_TURN_S = 0.5e-3  # sending stops after this long in a turn, so ACKs and CNPs are read: a
                    # CPU-bound loop (a guest under software emulation) once sent for 0.5 s
                    # while its ACKs and CNPs waited, inflating srtt 10x and delaying every cut
RCVBUF = 32 << 20
WIRE_OVERHEAD = 14 + 20 + 8  # Ethernet, IPv4, UDP: what the host link carries besides the transport
FRAME_TOKENS = 4200  # about one full frame's bytes on the host link, in the serialiser's tokens
_ICRC = struct.Struct("<I")
_NO_ANCILLARY: list = []
_CMSG_HEADER = socket.CMSG_LEN(0)
_STAMP_ONLY = socket.CMSG_SPACE(_TIMESPEC.size)  # a datagram's control messages: its arrival time alone
_SOCK_FILTER = struct.Struct("HBBI")  # struct sock_filter: code, jt, jf, k
# Classic BPF over an IPv4 packet (a raw socket's view): pass unfragmented UDP to port 4791.
ROCE_FILTER = (
    (0x28, 0, 0, 6),  # ldh [6]: flags and fragment offset
    (0x45, 4, 0, 0x1FFF),  # jset #0x1fff: a fragment -> drop
    (0xB1, 0, 0, 0),  # ldxb 4*([0]&0xf): the IP header's length
    (0x48, 0, 0, 2),  # ldh [x+2]: the UDP destination port
    (0x15, 0, 1, wire.ROCE_PORT),  # jeq #4791 -> pass, else drop
    (0x06, 0, 0, 0x40000),  # ret: the whole packet
    (0x06, 0, 0, 0),  # ret 0: drop
)
DROP_ALL = ((0x06, 0, 0, 0),)


class NicError(OSError):
    """The soft-NIC cannot open what it needs (its receive sockets)."""


def _arrival(stamp) -> float | None:
    """An SO_TIMESTAMPNS control message as CLOCK_REALTIME seconds (None without one)."""
    if stamp is None:
        return None
    sec, nsec = _TIMESPEC.unpack(stamp[:_TIMESPEC.size])
    return sec + nsec * 1e-9


def attach_filter(sock: socket.socket, program) -> None:
    """Attach a classic BPF program (a sequence of (code, jt, jf, k)) to ``sock``."""
    import ctypes

    insns = ctypes.create_string_buffer(b"".join(_SOCK_FILTER.pack(*i) for i in program))
    fprog = struct.pack("HL", len(program), ctypes.addressof(insns))
    sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)  # the kernel copies the program


@dataclass(frozen=True)
class QpState:
    """One QP's state for telemetry, in emulated units (wall seconds, emulated bytes and bit/s)."""

    allowed_bits: float  # what DCQCN's rate allowed since the start (its integral): mean rates
    rc_bps: float  # DCQCN's current rate (the line's without DCQCN)
    target_bps: float  # DCQCN's target rate
    alpha: float  # 0 without DCQCN
    cnps_received: int
    cnps_sent: int
    ce_received: int  # CE-marked data packets it received
    tx_bytes: int  # bytes it put on the host link
    unsent: int  # packets posted and never sent yet: with none, the rate owes the QP nothing
    retransmits: int = 0  # packets it sent again

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class NicCounters:
    rx_packets: int = 0
    tx_packets: int = 0
    rx_ce: int = 0
    socket_overflow: int = 0  # datagrams the kernel dropped before the NIC could read them
    # Packets the host's egress would not take at once (its queue paused by PFC, so the socket's
    # send buffer filled): they waited in the NIC's transmit queue, none was lost.
    tx_stalled: int = 0
    dropped: dict[str, int] = field(default_factory=dict)  # reason -> packets refused before any QP

    def drop(self, reason: str) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + 1


class SoftNic:
    """``line_rate_bps`` and the DCQCN profile ``cc`` are in the loop's units (emulated bytes per
    virtual second: the real rate x scale x dilation; see the module's docstring); ``clock``
    is the virtual clock (default: CLOCK_MONOTONIC / ``dilation``)."""

    def __init__(self, ip: str, line_rate_bps: float = 0.0, burst_bytes: int = 64 << 10,
                 clock=None, cc: dcqcn.Profile | None = None, dilation: float = 1.0,
                 pace_burst: int = 2 * (4096 + 100), pace_burst_s: float = 0.0) -> None:
        self.ip = ip
        # DCQCN: with a profile (already scaled), each QP gets a reaction point and pacer for
        # what it sends and a notification point for what it receives.
        self.cc = cc if cc is not None and cc.enabled else None
        self._np: dict[int, dcqcn.NotificationPoint] = {}
        self.pd = ProtectionDomain()
        self.dilation = dilation
        self.wall = time.monotonic
        self.clock = clock or (lambda: time.monotonic() / dilation)
        self._pace_burst = pace_burst
        self._pace_burst_s = pace_burst_s  # virtual seconds of a QP's rate its pacer may save up
        _tight_timers()
        # CNPs waiting out the NP's processing delay, and CNPs waiting out the RP's reaction
        # delay (profile fields, virtual seconds): (due, seq, qpn, packet, kernel arrival).
        self._cnp_out: list[tuple] = []
        self._cnp_in: list[tuple] = []
        self._seq = 0
        self.counters = NicCounters()
        self.qps: dict[int, QueuePair] = {}
        self._peer: dict[int, tuple[str, socket.socket, int]] = {}  # qpn -> (peer ip, socket, sport)
        self._next_qpn = QPN_BASE
        self._peer_raw: dict[int, bytes] = {}  # qpn -> the peer's address as the IP header has it
        self._peer_addr: dict[int, tuple[str, int]] = {}  # qpn -> where its packets go
        self._tx_crc: dict[int, dict] = {}  # qpn -> its ICRCs over the headers and the BTH's first word
        self._rate = line_rate_bps / 8  # bytes per second; 0: unpaced
        self._burst = burst_bytes
        self._tokens = float(burst_bytes)
        self._refilled = self.clock()
        self._crc_cache: dict[tuple, int] = {}
        self._rx_crc: dict[bytes, int] = {}
        self._rr = 0
        self.tx_bytes: dict[int, int] = {}  # qpn -> bytes this QP put on the host link
        self.ce_data: dict[int, int] = {}  # qpn -> CE-marked data packets it received
        self.cnp_delays: list[float] = []  # wall s from a marked packet's arrival to its CNP's send
        self.cnp_reactions: list[float] = []  # wall s from a CNP's arrival to the rate cut it caused
        # How late the loop was against the protocol (wall s): a CNP's send after the time the NP
        # and the configured delay set for it; a cut after its CNP's arrival and reaction delay.
        # Only these are the emulator's own: the rest of the feedback delay is modelled.
        self.cnp_late: list[float] = []
        self.reaction_late: list[float] = []
        self._ip_raw = socket.inet_aton(ip)
        try:
            self.rx = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_UDP)
        except PermissionError as e:
            raise NicError(e.errno, "the soft-NIC reads RoCEv2 packets with their IP headers (the ICRC covers "
                                    "them) through a raw socket: run it as root or with CAP_NET_RAW") from e
        attach_filter(self.rx, ROCE_FILTER)
        self.rx.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE if _root() else socket.SO_RCVBUF, RCVBUF)
        self.rx.setsockopt(socket.SOL_SOCKET, SO_RXQ_OVFL, 1)
        self.rx.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        self.rx.bind((ip, 0))
        self.rx.setblocking(False)
        if not mmsg.available():
            self.rx.close()
            raise NicError(errno.ENOSYS, "the soft-NIC reads its packets with recvmmsg(2) and LP64 structures "
                                         "(Linux on a 64-bit CPU); this system has neither")
        self._batch = mmsg.RecvBatch(self.rx.fileno(), RX_BATCH)
        # The port's owner, so no datagram to it is answered with ICMP; it never reads.
        self.port = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        attach_filter(self.port, DROP_ALL)
        self.port.bind((ip, wire.ROCE_PORT))
        # The transmit queue behind a paused link, in order: (socket, buffers, ancillary, address).
        self._stalled: collections.deque = collections.deque()
        # Loss on purpose, for tests and interop checks: called as lose("rx" | "tx", transport
        # headers) per data packet; True loses it (counted as injected_rx / injected_tx).
        self.lose = None

    def close(self) -> None:
        for _, sock, _ in self._peer.values():
            sock.close()
        self.rx.close()
        self.port.close()

    # --- verbs ---

    def create_qp(self, peer_ip: str, config: QpConfig | None = None, send_cq: CompletionQueue | None = None,
                  recv_cq: CompletionQueue | None = None, initial_psn: int = 0, qpn: int | None = None) -> QueuePair:
        """A QP towards ``peer_ip``; ``qpn`` as the application chooses it (the next free one
        from 0x100 by default). Its UDP source port follows from the QPN."""
        if qpn is None:
            qpn = self._next_qpn
            while qpn in self.qps:
                qpn += 1
            self._next_qpn = qpn + 1
        elif not 2 <= qpn <= wire.QPN_MASK:
            raise ValueError(f"QPN {qpn:#x}: 0 and 1 are the management QPs; a QPN has 24 bits")
        elif qpn in self.qps:
            raise ValueError(f"QPN {qpn:#x} is in use")
        qp = QueuePair(qpn, self.pd, send_cq or CompletionQueue(), recv_cq or CompletionQueue(), config,
                       initial_psn)
        sport = SPORT_BASE + qpn % 16384
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.setsockopt(socket.SOL_SOCKET, SO_NO_CHECK, 1)
        s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, (DSCP_DATA << 2) | ECT0)
        s.setsockopt(socket.IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_DO)
        s.setblocking(False)  # a paused link must stall the transmit queue, not the whole NIC
        try:
            s.bind((self.ip, sport))
        except OSError:  # another QPN took this port (QPNs chosen by the application): any will do
            s.bind((self.ip, 0))
            sport = s.getsockname()[1]
        self.qps[qpn] = qp
        self._peer[qpn] = (peer_ip, s, sport)
        self._peer_raw[qpn] = socket.inet_aton(peer_ip)
        self._peer_addr[qpn] = (peer_ip, wire.ROCE_PORT)
        self._tx_crc[qpn] = {}
        self.tx_bytes[qpn] = 0
        self.ce_data[qpn] = 0
        if self.cc is not None:
            qp.rp = dcqcn.ReactionPoint(self.cc, self._rate * 8 or 1e12, self.clock())
            qp.pace = dcqcn.RatePacer(qp.rp, self._pace_burst, burst_s=self._pace_burst_s)
            self._np[qpn] = dcqcn.NotificationPoint(self.cc)
        return qp

    def close_qp(self, qpn: int) -> None:
        """Destroy a QP: its socket closes and packets to it count as unknown_qp from now on."""
        self.qps.pop(qpn)
        _, sock, _ = self._peer.pop(qpn)
        sock.close()
        for table in (self._peer_raw, self._peer_addr, self._tx_crc, self.tx_bytes, self.ce_data, self._np):
            table.pop(qpn, None)

    # --- the loop ---

    def _icrc_prefix(self, dst: str, sport: int, tlen: int) -> int:
        """The ICRC over the headers of a packet this NIC sends (DF, IP ID 0: see the top)."""
        key = (dst, sport, tlen)
        crc = self._crc_cache.get(key)
        if crc is None:
            if len(self._crc_cache) > 4096:
                self._crc_cache.clear()
            crc = self._crc_cache[key] = wire.icrc_headers(*wire.ipv4_udp_headers(self.ip, dst, sport, tlen))
        return crc

    def _icrc_received(self, headers: memoryview, hl: int) -> int:
        """The ICRC over the headers a packet arrived with. Keyed by their bytes: a peer that
        sends IP ID 0 hits the cache; one that numbers its packets costs a CRC of 36 bytes."""
        key = headers.tobytes()
        crc = self._rx_crc.get(key)
        if crc is None:
            if len(self._rx_crc) > 4096:  # changing IDs or random sources must not grow it forever
                self._rx_crc.clear()
            crc = self._rx_crc[key] = wire.icrc_headers(key[:hl], key[hl:])
        return crc

    def _icrc(self, peer: str, sport: int, parts) -> bytes:
        """The ICRC of a packet (headers, payload, pad) we send to ``peer`` from ``sport``."""
        tlen = sum(len(p) for p in parts) + wire.ICRC_LEN
        return _ICRC.pack(wire.icrc_transport(self._icrc_prefix(peer, sport, tlen), parts))

    def _send(self, qpn: int, parts) -> int:
        """Put one packet (its parts: headers, then payload and pad if any) of a QP on the wire;
        the bytes it takes on the host link."""
        peer, sock, sport = self._peer[qpn]
        tlen = wire.ICRC_LEN
        for p in parts:
            tlen += len(p)
        first = parts[0]
        # The ICRC up to the BTH's masked byte depends on the length and the BTH's first word only.
        key = (tlen, first[:4])
        heads = self._tx_crc[qpn]
        head = heads.get(key)
        if head is None:
            if len(heads) > 4096:  # last packets of many lengths must not grow it forever
                heads.clear()
            head = heads[key] = wire.icrc_bth_head(self._icrc_prefix(peer, sport, tlen), key[1])
        crc = crc32(first[5:], head)
        for p in parts[1:]:
            crc = crc32(p, crc)
        if self.lose is not None and self.lose("tx", first):
            self.counters.drop("injected_tx")  # lost on the wire: it still took its time there
        else:
            self._xmit(sock, [*parts, _ICRC.pack(crc)], _NO_ANCILLARY, self._peer_addr[qpn])
        self.counters.tx_packets += 1
        n = tlen + WIRE_OVERHEAD
        self.tx_bytes[qpn] += n
        return n

    def _xmit(self, sock: socket.socket, buffers: list, ancillary: list, address: tuple) -> None:
        """Hand a packet to the kernel, or queue it behind those the paused link holds back."""
        if not self._stalled:
            try:
                sock.sendmsg(buffers, ancillary, 0, address)
                return
            except BlockingIOError:
                pass
        # The buffers may be views of memory the QP reuses: keep the bytes as they are now.
        self._stalled.append((sock, [bytes(b) for b in buffers], ancillary, address))
        self.counters.tx_stalled += 1

    def _flush(self) -> bool:
        """Send what waited behind a paused link, in order; True when nothing waits any more."""
        while self._stalled:
            sock, buffers, ancillary, address = self._stalled[0]
            try:
                sock.sendmsg(buffers, ancillary, 0, address)
            except BlockingIOError:
                return False
            self._stalled.popleft()
        return True

    def _send_cnp(self, qp, arrived: float | None, due: float, now: float) -> None:
        """A congestion notification to the QP's peer: BECN set, non-ECT, DSCP 48. ``arrived``:
        the wall (CLOCK_REALTIME) arrival of the marked packet that earned it."""
        peer, sock, sport = self._peer[qp.qpn]
        body = wire.build(wire.Bth(wire.CNP, qp.dqpn, 0, becn=True))
        tos = struct.pack("=i", DSCP_CNP << 2)
        self._xmit(sock, [body, self._icrc(peer, sport, [body])], [(socket.IPPROTO_IP, socket.IP_TOS, tos)],
                   (peer, wire.ROCE_PORT))
        qp.stats.cnps_sent += 1
        self.counters.tx_packets += 1
        if arrived is not None:  # how late the answer left: the receiver's share of the feedback delay
            self.cnp_delays.append(time.time() - arrived)
        self.cnp_late.append(max(0.0, now - due) * self.dilation)

    def _receive(self, now: float) -> int:
        batch = self._batch
        c = self.counters
        # Kernel arrival times are CLOCK_REALTIME: put them on the virtual clock through one
        # reading of both clocks per batch, taken together.
        self._rt_now, self._v_now = time.time(), self.clock()
        got = batch.read(RX_BATCH)
        controls = batch.control_bytes
        for i in range(got):
            c.rx_packets += 1
            at = i * mmsg.CONTROL
            if batch.control_length(i) == _STAMP_ONLY:  # the usual case: the arrival time alone
                stamp = controls[at + _CMSG_HEADER:at + _STAMP_ONLY]
            else:
                stamp = None
                for cm in batch.controls(i):
                    if cm.level == socket.SOL_SOCKET and cm.kind == SO_RXQ_OVFL and len(cm.data) >= 4:
                        c.socket_overflow = struct.unpack("=I", cm.data[:4])[0]
                    elif cm.level == socket.SOL_SOCKET and cm.kind == SO_TIMESTAMPNS and len(cm.data) >= _TIMESPEC.size:
                        stamp = cm.data
            try:
                self._input(batch.frame(i), stamp, now)
            except wire.Malformed as e:
                c.drop(e.reason)
            except Exception:  # a bug must cost one packet, never the NIC: counted, and tests assert none
                c.drop("internal_error")
        return got

    def _virtual(self, arrived: float | None, now: float) -> float:
        """A kernel arrival time (CLOCK_REALTIME) on the virtual clock; ``now`` without one."""
        if arrived is None:
            return now
        return self._v_now - (self._rt_now - arrived) / self.dilation

    def _schedule(self, heap: list, due: float, qpn: int, pkt, arrived: float | None) -> None:
        self._seq += 1
        heapq.heappush(heap, (due, self._seq, qpn, pkt, arrived))

    def _due_cnps(self) -> None:
        """Send the CNPs whose processing delay is over; apply the CNPs whose reaction delay is."""
        now = self.clock()  # the sends and cuts happen now, whatever the turn began with
        while self._cnp_out and self._cnp_out[0][0] <= now:
            due, _, qpn, _, arrived = heapq.heappop(self._cnp_out)
            if qpn in self.qps:  # not closed meanwhile
                self._send_cnp(self.qps[qpn], arrived, due, now)
        while self._cnp_in and self._cnp_in[0][0] <= now:
            due, _, qpn, pkt, arrived = heapq.heappop(self._cnp_in)
            if qpn in self.qps:
                self._react(self.qps[qpn], pkt, now, arrived, due)

    def _react(self, qp, pkt, now: float, arrived: float | None, due: float) -> None:
        qp.receive(pkt, now)
        if qp.rp is not None:  # the sender's share of the feedback delay
            if arrived is not None:
                self.cnp_reactions.append(time.time() - arrived)
            self.reaction_late.append(max(0.0, now - due) * self.dilation)

    def _input(self, frame: memoryview, stamp: memoryview | None, now: float) -> None:
        """One IPv4 packet (the raw socket's view: IP header, UDP header, BTH..ICRC) and its
        kernel arrival time (a struct timespec), read only where it is used (CNPs, CE marks)."""
        size = len(frame)
        hl = (frame[0] & 0xF) * 4 if size else 0
        if size < 20 or frame[0] >> 4 != 4 or hl < 20 or size < hl + 8:
            raise wire.Malformed("truncated", f"{size} bytes: no IPv4 and UDP header")
        data = frame[hl + 8:]
        n = len(data)
        if n < wire.BTH_LEN + wire.ICRC_LEN:
            raise wire.Malformed("truncated", f"{n} bytes")
        if (frame[hl + 4] << 8 | frame[hl + 5]) != n + 8:
            raise wire.Malformed("bad_length", f"UDP length {frame[hl + 4] << 8 | frame[hl + 5]} for {n + 8} bytes")
        if self.lose is not None and self.lose("rx", data):
            raise wire.Malformed("injected_rx")
        ce = frame[1] & 3 == CE
        if ce:
            self.counters.rx_ce += 1
        crc = wire.icrc_transport(self._icrc_received(frame[:hl + 8], hl), (data[:n - 4],))
        if _ICRC.unpack_from(data, n - 4)[0] != crc:
            raise wire.Malformed("bad_icrc")
        qp = None
        plain = wire.plain_write(data)
        if plain is not None:
            # The bulk of the traffic, carried out without a parsed Packet when the QP expects it
            # (write_next says); anything else takes the full parse below, unchanged.
            dqpn, opcode, psn, ackreq, body = plain
            qp = self.qps.get(dqpn)
            if qp is None or frame[12:16] != self._peer_raw[dqpn] or not qp.connected \
                    or not qp.write_next(opcode, psn, ackreq, body):
                qp = None
        if qp is None:
            pkt = wire.parse(data)
            opcode = pkt.bth.opcode
            qp = self.qps.get(pkt.bth.dqpn)
            if qp is None:
                raise wire.Malformed("unknown_qp", hex(pkt.bth.dqpn))
            if frame[12:16] != self._peer_raw[qp.qpn] or not qp.connected:
                # RC: only the connected peer may talk to a QP
                raise wire.Malformed("wrong_source", socket.inet_ntoa(frame[12:16]))
            if opcode == wire.CNP:
                # The NIC reacts reaction_delay (virtual) after the CNP arrived, or as soon as the
                # loop gets to it if that is later.
                arrived = _arrival(stamp)
                due = self._virtual(arrived, now) + (self.cc.reaction_delay_s if self.cc else 0.0)
                if due <= now:
                    self._react(qp, pkt, now, arrived, due)
                else:
                    self._schedule(self._cnp_in, due, qp.qpn, pkt, arrived)
            else:
                qp.receive(pkt, now)
        if ce and opcode <= wire.WRITE_ONLY_IMM:
            self.ce_data[qp.qpn] += 1
            arrived = _arrival(stamp)
            due = self._np[qp.qpn].on_ce(self._virtual(arrived, now)) if qp.qpn in self._np else None
            if due is not None:  # now, or when the NP's interval lets a deferred one go
                due += self.cc.cnp_delay_s
                if due <= now:
                    self._send_cnp(qp, arrived, due, now)
                else:
                    self._schedule(self._cnp_out, due, qp.qpn, None, arrived)
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
        self._due_cnps()
        # Reading a batch takes its time (milliseconds in a software-emulated guest): what is
        # sent now is sent now, or its send times (RTT samples, retransmission timers) are old.
        now = self.clock()
        self._refill(now)
        sent = 0
        flowing = self._flush()
        for qpn, qp in self.qps.items():
            if qp.outbox:
                for parts in qp.outbox:
                    self._tokens -= self._send(qpn, parts)
                qp.outbox.clear()
        # Data, round robin over QPs while the line has tokens. Each turn starts at the QP after
        # the last one that sent, as a NIC's arbiter serves the QPs with work in turn: starting
        # one QP further on per turn would hand every turn that starts on an idle QP (a receive
        # QP, a finished one) to the first busy QP after it, so the shares of one message that
        # were split over QPs would finish one after another instead of together.
        # On a paced line each QP's visit is its share of the tokens among the QPs with work: a
        # QP at the head of a turn that found tokens saved up (the loop slept, or was not
        # scheduled) must not take them all while the others wait for the next turn.
        # A turn with no QP that has work (a receiving NIC's, mostly) has nothing to go round.
        # Each pass of the turn goes on from where the last one stopped, too: one that started
        # over at the turn's first QP would give the QPs at its head a frame more every pass
        # the refilled tokens allow.
        working = sum(qp.has_work for qp in self.qps.values())
        items = list(self.qps.items()) if working else []
        more = flowing and working > 0  # behind a paused link no new data goes; answers queue behind it
        turn_end = self.wall() + TX_TURN_S  # from when sending starts: reading took its own time
        share = max(1, working) if self._rate else 1
        while more and (not self._rate or self._tokens > 0):
            more = False
            start = self._rr % len(items)
            order = items[start:] + items[:start]
            for i, (qpn, qp) in enumerate(order):
                if self._rate and self._tokens <= 0:
                    break
                budget = TX_BATCH if not self._rate else max(1, min(TX_BATCH, int(self._tokens // FRAME_TOKENS // share) + 1))
                pkts = qp.transmit(now, budget)
                if pkts:
                    self._rr = start + i + 1
                for parts in pkts:
                    self._tokens -= self._send(qpn, parts)
                sent += len(pkts)
                more |= len(pkts) == budget
                if pkts and self.wall() >= turn_end:
                    more = False  # read what came in meanwhile; the next turn goes on sending
                    break
            now = self.clock()
            if self._rate:
                self._refill(now)
        for qp in self.qps.values():
            if qp.deadline is not None and qp.deadline <= now:
                qp.on_timer(now)
        self._due_cnps()
        if got or sent:
            return
        # Idle: sleep until a packet comes, the line has tokens again, a timer or a delayed CNP
        # is due (virtual seconds, slept as wall seconds), at most max_wait of wall time.
        wait = max_wait / self.dilation
        for heap in (self._cnp_out, self._cnp_in):
            if heap:
                wait = min(wait, heap[0][0] - now)
        for qp in self.qps.values():
            if qp.deadline is not None:
                wait = min(wait, qp.deadline - now)
            if self._rate and self._tokens <= 0 and qp.nxt < qp.end:
                # Out of tokens: wake when the line has taken all but a frame of what was sent
                # (the host's queue still holds that frame, so the link never idles), to send
                # a burst per wake, not a frame per wake.
                wait = min(wait, (max(0.0, self._burst - FRAME_TOKENS) - self._tokens) / self._rate)
            if isinstance(qp.pace, dcqcn.RatePacer) and qp.nxt < qp.end:
                # 0 when the pacer has let tokens build since the turn tried it: turn again now,
                # never sleep the whole max_wait while a packet may go; and wake when the rate
                # may rise, not when the next packet is due at the old, slower rate.
                wait = min(wait, qp.pace.wait(now), qp.rp.next_change() - now)
        if wait > 0:
            # Behind a paused link: also wake when its socket can take the next packet.
            select.select([self.rx], [self._stalled[0][0]] if self._stalled else [], [], wait * self.dilation)

    def run(self, done, timeout: float, max_wait: float = 0.05, busy=None) -> bool:
        """Turn until ``done()``; False if ``timeout`` wall seconds passed first. ``done`` is
        asked at least every ``max_wait`` wall seconds; while ``busy()`` (the application has
        work it put off to let the NIC turn), the NIC does not sleep between turns."""
        end = self.wall() + timeout
        while not done():
            if self.wall() > end:
                return False
            self.step(0.0 if busy is not None and busy() else max_wait)
        return True

    def qp_state(self, qpn: int) -> QpState:
        """One QP now, in emulated units (wall time): without DCQCN the rate is the line's."""
        qp = self.qps[qpn]
        rp = qp.rp
        now = self.clock()
        line = self._rate * 8
        allowed = rp.allowed_bits(now) if rp else line * now
        d = self.dilation  # the loop's rates are per virtual second: per wall second is / d
        return QpState(allowed, (rp.rc if rp else line) / d, (rp.rt if rp else line) / d, rp.alpha if rp else 0.0,
                       qp.stats.cnps_received, qp.stats.cnps_sent, self.ce_data[qpn], self.tx_bytes[qpn],
                       qp.end - qp.nxt, qp.stats.retransmits)

    @property
    def cnps_pending(self) -> int:
        """CNPs this NIC still holds back: to send (processing delay) or to act on (reaction delay)."""
        return len(self._cnp_out) + len(self._cnp_in)

    def stats(self) -> dict:
        return {"rx_packets": self.counters.rx_packets, "tx_packets": self.counters.tx_packets,
                "rx_ce": self.counters.rx_ce, "socket_overflow": self.counters.socket_overflow,
                "dropped": dict(self.counters.dropped), "cnp_delay_s": summary(self.cnp_delays),
                "cnp_reaction_s": summary(self.cnp_reactions), "cnp_late_s": summary(self.cnp_late),
                "reaction_late_s": summary(self.reaction_late)}


PR_SET_TIMERSLACK = 29
TIMER_SLACK_NS = 1000


def _tight_timers() -> None:
    """This process's timer slack to 1 us (Linux adds up to 50 us to every sleep by default): a
    paced QP wakes when its next packet is due, not up to 50 us later. Per process, nothing global."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_TIMERSLACK, TIMER_SLACK_NS, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: the default slack only makes pacing coarser


def _root() -> bool:
    import os

    return os.geteuid() == 0
