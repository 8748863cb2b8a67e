"""RC transport: one queue pair's requester and responder, as a pure state machine.

No sockets and no clock of its own: the caller hands in parsed packets and the time, and takes
out what to put on the wire (``transmit`` for data, ``outbox`` for ACKs and NAKs) and the next
time the QP wants to be woken (``deadline``). Tests drive it with a fake network and a fake
clock; the socket loop (nic/loop.py) drives it with real ones.

Two loss-recovery modes. ``QpConfig.mode`` is what a QP offers; what it uses is agreed per QP
at connect time (``connect(..., sack=)``: the peer's offer, exchanged with the QPN and PSN the
way verbs applications exchange them), because the extension changes what a field means:

- ``go-back-n``, the standard (IBTA 9.7.5; what rxe and every NIC without IRN does): the
  responder drops anything after a hole and sends one NAK "PSN sequence error" carrying the PSN
  it expects, with AETH MSN the count of messages it completed; the requester resends
  everything from there. A QP that offered ``selective`` to a peer that did not agree runs this.
- ``selective`` (IRN-style), only when both sides agreed: the responder keeps out-of-order
  packets (up to ``rx_window``) and answers each with a NAK whose BTH PSN is the PSN it expects
  (the cumulative ACK) and whose AETH MSN field carries the PSN it has just stored (the
  selective ACK; IRN puts the same field in the NAK). The encoding is the standard NAK's, so
  analysers decode it; only the agreed peer reads MSN as a PSN. The requester marks that packet
  held and resends only packets sent more than ``reorder_window`` transmissions before it that
  are neither ACKed nor held (RACK's rule: a hole is lost once later packets got through), so a
  hole costs one retransmission.

Operations are the RC verbs: WRITE, WRITE with immediate, SEND (with immediate) into posted
receives, and READ, both as requester and responder (responses segmented at the path MTU, a
lost response re-requested from the first missing PSN, as IBTA 9.7.5.1 does it). A responder
without a receive posted answers RNR NAK with its ``min_rnr_timer``; a requester waits the time
that code stands for (IBTA table 45) and tries again, ``rnr_retry_limit`` times (7: forever).

Both cap what is in flight at ``max_inflight`` packets (one BDP), time out adaptively from the
measured RTT (Jacobson/Karels, Karn's rule, exponential backoff), give up after ``retry_limit``
timeouts without progress, and execute every PSN exactly once: data reaches memory only when
its PSN is the next expected one, so duplicates and replays never write.
"""
from __future__ import annotations

import heapq
from bisect import bisect_right
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from emulator.nic import wire
from emulator.nic.memory import AccessError, ProtectionDomain, REMOTE_READ, REMOTE_WRITE
from emulator.nic.wire import Aeth, Packet, psn_diff, PSN_MOD

MODES = ("selective", "go-back-n")

# Work completion statuses (ibv_wc_status names).
SUCCESS = "success"
LOC_LEN_ERR = "local_length_error"
REM_INV_REQ_ERR = "remote_invalid_request"
REM_ACCESS_ERR = "remote_access_error"
REM_OP_ERR = "remote_operational_error"
RETRY_EXC_ERR = "retry_exceeded"
RNR_RETRY_EXC_ERR = "rnr_retry_exceeded"
WR_FLUSH_ERR = "flushed"

_BTH, _RETH, _IMM, _ACK = wire.BTH_STRUCT, wire.RETH_STRUCT, wire.IMM_STRUCT, wire.BTH_AETH_STRUCT
_PAD = (b"", b"\0", b"\0\0", b"\0\0\0")
_OP_FIRST, _OP_MIDDLE, _OP_LAST, _OP_LAST_IMM, _OP_ONLY, _OP_ONLY_IMM = range(6)
_SEND_BASE, _WRITE_BASE = wire.SEND_FIRST, wire.WRITE_FIRST
AETH_ACK_NO_CREDIT = 0x1F  # ACK syndrome with "credits not tracked"
_AETH_ACK = AETH_ACK_NO_CREDIT << 24
# IBTA table 45: what an RNR NAK's 5-bit timer field asks the requester to wait, in ms.
RNR_TIMER_MS = (655.36, 0.01, 0.02, 0.03, 0.04, 0.06, 0.08, 0.12, 0.16, 0.24, 0.32, 0.48, 0.64, 0.96, 1.28,
                1.92, 2.56, 3.84, 5.12, 7.68, 10.24, 15.36, 20.48, 30.72, 40.96, 61.44, 81.92, 122.88,
                163.84, 245.76, 327.68, 491.52)
RNR_RETRY_FOREVER = 7  # IB's rnr_retry 7: retry without limit


def rnr_delay(code: int) -> float:
    """Seconds an RNR NAK with timer field ``code`` asks the requester to wait."""
    return RNR_TIMER_MS[code & 0x1F] / 1000


@dataclass
class QpConfig:
    mode: str = "selective"
    mtu: int = 4096  # payload bytes per packet (the path MTU's RoCE payload)
    max_inflight: int = 1024  # packets in flight: one BDP; the loop sizes it from rate and RTT
    rx_window: int = 8192  # PSNs the responder accepts ahead of the one it expects
    ackreq_every: int = 16  # the requester asks for an ACK at least this often
    reorder_window: int = 3  # selective: later transmissions that must get through before a hole counts as lost
    rto_initial: float = 0.25  # s, before any RTT sample (a cross-DC RTT is 30 ms)
    rto_min: float = 0.010  # s: below this, scheduling stalls of a Python NIC on a busy host look like loss
    rto_max: float = 2.0
    retry_limit: int = 7  # timeouts without progress before the WR fails (IB's retry_cnt)
    rnr_retry_limit: int = RNR_RETRY_FOREVER  # RNR NAKs in a row before the WR fails (IB's rnr_retry)
    min_rnr_timer: int = 1  # responder: the RNR NAK's timer code (table 45: 1 is 10 us)
    max_rd_atomic: int = 16  # requester: READs outstanding at once (the responder's resources)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"transport mode {self.mode!r}: use one of {', '.join(MODES)}")
        if self.mtu <= 0 or self.mtu % 4:
            raise ValueError(f"mtu {self.mtu}: must be a positive multiple of 4")
        if not 0 <= self.min_rnr_timer <= 31:
            raise ValueError(f"min_rnr_timer {self.min_rnr_timer}: an IB timer code is 0..31")
        if self.max_rd_atomic < 1:
            raise ValueError(f"max_rd_atomic {self.max_rd_atomic}: at least one READ must be allowed")


@dataclass(frozen=True)
class WorkCompletion:
    wr_id: int
    status: str
    opcode: str  # write | send | read | recv | recv_rdma_with_imm (ibv_wc_opcode)
    qpn: int
    byte_len: int = 0
    imm: int | None = None


@dataclass
class QpStats:
    """What a QP did, for telemetry: every packet it sent or dropped is in one counter."""

    data_packets: int = 0  # first transmissions
    retransmits: int = 0
    timeouts: int = 0
    acks_sent: int = 0
    naks_sent: int = 0
    sacks_sent: int = 0
    acks_received: int = 0
    naks_received: int = 0
    rnr_naks_received: int = 0
    rtt_samples: int = 0
    bytes_acked: int = 0
    delivered: int = 0  # responder: packets executed (each PSN once)
    held: int = 0  # responder: out-of-order packets kept (selective)
    cnps_received: int = 0  # requester: congestion notifications for this QP
    cnps_sent: int = 0  # responder: congestion notifications sent to the peer
    read_responses: int = 0  # responder: READ response packets sent (first answers and again)
    dropped: dict[str, int] = field(default_factory=dict)  # reason -> packets

    def drop(self, reason: str) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + 1


@dataclass(eq=False)
class _Wr:
    wr_id: int
    kind: str  # write | send | read
    data: memoryview  # read: where the responses land
    first: int  # sequence number of its first packet
    npkts: int
    remote_va: int = 0
    rkey: int = 0
    imm: int | None = None
    signaled: bool = True


@dataclass(eq=False)
class _RecvWr:
    wr_id: int
    buf: memoryview


class CompletionQueue:
    def __init__(self) -> None:
        self._q: deque[WorkCompletion] = deque()

    def push(self, wc: WorkCompletion) -> None:
        self._q.append(wc)

    def poll(self, n: int = 64) -> list[WorkCompletion]:
        out = []
        while self._q and len(out) < n:
            out.append(self._q.popleft())
        return out

    def __len__(self) -> int:
        return len(self._q)


class QueuePair:
    """One RC QP. Create it, ``connect`` it to the peer's (QPN, first PSN), post work, then
    feed it packets and time."""

    def __init__(self, qpn: int, pd: ProtectionDomain, send_cq: CompletionQueue, recv_cq: CompletionQueue,
                 config: QpConfig | None = None, initial_psn: int = 0) -> None:
        self.qpn = qpn
        self.pd = pd
        self.send_cq = send_cq
        self.recv_cq = recv_cq
        self.cfg = config or QpConfig()
        self.stats = QpStats()
        self.error: str | None = None  # set once the QP is in the error state
        self.outbox: list[list[bytes]] = []  # ACKs/NAKs to send before data
        self.dqpn = 0
        self.connected = False
        self.selective = False  # the selective-repeat extension, agreed at connect
        # Requester. Sequence numbers are unbounded ints; the wire PSN is (ipsn + seq) mod 2^24.
        self.ipsn = initial_psn % PSN_MOD
        self._wrs: list[_Wr] = []
        self._firsts: list[int] = []
        self._head = 0  # first WR not yet completed
        self.una = 0  # oldest packet not acknowledged
        self.nxt = 0  # next packet never sent
        self.end = 0  # one past the last packet posted
        self._out: OrderedDict[int, list] = OrderedDict()  # in flight, in transmission order: [txc, time, retx]
        self._txc = 0
        self._req_seq = -1  # the highest packet sent with AckReq: the timer runs only for those
        self._lost: list[int] = []  # heap of packets to resend
        self._lost_set: set[int] = set()
        self.srtt: float | None = None
        self.rttvar = 0.0
        self.rto = self.cfg.rto_initial
        self.deadline: float | None = None
        self._retries = 0
        self._rnr_retries = 0
        self._hold_until = 0.0
        self._rnr_wait = False  # the deadline is the end of an RNR wait, not a timeout
        self._reads_out = 0  # READ WRs sent and not complete
        self._acked = 0  # one past the highest packet an ACK covered, READs answered or not
        self._gone_back = -1  # una when a READ's missing response last sent us back: once per hole
        self.pace = None  # optional callable(now, nbytes) -> bool: may this packet go now (DCQCN's pacer)
        self.rp = None  # optional dcqcn.ReactionPoint: CNPs for this QP go to it
        # Responder.
        self.epsn = 0
        self.msn = 0
        self._held: dict[int, Packet] = {}
        self._nak_sent = False
        self._recvs: deque[_RecvWr] = deque()
        self._w_buf: memoryview | None = None  # the RDMA WRITE being received: where the next byte goes
        self._w_off = 0
        self._w_left = 0
        self._w_len = 0
        self._r_wr: _RecvWr | None = None  # the SEND being received
        self._r_off = 0
        self._rnr_sent = False  # an RNR NAK is out: later packets wait for its retry, no NAK
        self._last_op = -1  # the opcode executed last

    # --- connection ---

    def connect(self, dqpn: int, remote_psn: int, sack: bool = False) -> None:
        """RTR+RTS in one step: the peer's QPN, the first PSN the peer will send us, and whether
        the peer agreed to the selective-repeat extension (a standard peer never does)."""
        self.dqpn = dqpn & wire.QPN_MASK
        self.epsn = remote_psn % PSN_MOD
        self.selective = sack and self.cfg.mode == "selective"
        self.connected = True

    @property
    def offers_sack(self) -> bool:
        """What to tell the peer when exchanging connection parameters."""
        return self.cfg.mode == "selective"

    # --- posting work ---

    def post_write(self, wr_id: int, data: memoryview | bytes, remote_va: int, rkey: int,
                   imm: int | None = None, signaled: bool = True) -> None:
        self._post(_Wr(wr_id, "write", memoryview(data), 0, 0, remote_va, rkey, imm, signaled))

    def post_send(self, wr_id: int, data: memoryview | bytes, imm: int | None = None, signaled: bool = True) -> None:
        self._post(_Wr(wr_id, "send", memoryview(data), 0, 0, imm=imm, signaled=signaled))

    def post_read(self, wr_id: int, buf: memoryview | bytearray, remote_va: int, rkey: int,
                  signaled: bool = True) -> None:
        """Read len(buf) bytes at the peer's (remote_va, rkey) into ``buf``."""
        view = memoryview(buf)
        if view.readonly:
            raise ValueError("a READ needs a writable buffer")
        self._post(_Wr(wr_id, "read", view, 0, 0, remote_va, rkey, signaled=signaled))

    def post_recv(self, wr_id: int, buf: memoryview | bytearray) -> None:
        if self.error:
            self.recv_cq.push(WorkCompletion(wr_id, WR_FLUSH_ERR, "recv", self.qpn))
            return
        self._recvs.append(_RecvWr(wr_id, memoryview(buf)))

    def _post(self, wr: _Wr) -> None:
        if not self.connected:
            raise RuntimeError(f"QP {self.qpn:#x} is not connected")
        if self.error:
            self.send_cq.push(WorkCompletion(wr.wr_id, WR_FLUSH_ERR, wr.kind, self.qpn))
            return
        wr.first = self.end
        wr.npkts = max(1, -(-len(wr.data) // self.cfg.mtu))
        self.end += wr.npkts
        self._wrs.append(wr)
        self._firsts.append(wr.first)

    @property
    def has_work(self) -> bool:
        """Something posted is still to be sent, or sent again."""
        return self.error is None and (self.nxt < self.end or bool(self._lost_set))

    @property
    def idle(self) -> bool:
        """Nothing posted is outstanding."""
        return self.una == self.end

    def psn(self, seq: int) -> int:
        return (self.ipsn + seq) % PSN_MOD

    # --- requester: sending ---

    def transmit(self, now: float, budget: int) -> list[tuple[bytes, memoryview | bytes, bytes]]:
        """Up to ``budget`` packets to send now, retransmissions first: (headers, payload, pad)."""
        out: list[tuple[bytes, memoryview | bytes, bytes]] = []
        if self.error or now < self._hold_until:
            return out
        cfg = self.cfg
        while len(out) < budget:
            if len(self._out) >= cfg.max_inflight:
                break
            retx = False
            seq = -1
            while self._lost:
                s = heapq.heappop(self._lost)
                if s in self._lost_set:
                    self._lost_set.discard(s)
                    seq, retx = s, True
                    break
            if seq < 0:
                if self.nxt >= self.end or self.nxt - self.una >= cfg.rx_window:
                    break
                seq = self.nxt
            wr = self._wr_of(seq)
            if wr.kind == "read":
                if not retx and self._reads_out >= cfg.max_rd_atomic:
                    break
                pkt, ackreq = self._read_request(wr, seq), True
            else:
                pkt, ackreq = self._packet(wr, seq, retx)
            if self.pace is not None and not self.pace(now, len(pkt[1]) + len(pkt[0])):
                if retx:
                    self._mark_lost(seq)
                break
            if not retx:
                self.nxt += 1
                self.stats.data_packets += 1
            else:
                self.stats.retransmits += 1
            first = seq
            self._out[seq] = [self._txc, now, retx]
            if wr.kind == "read":
                # One request stands for all its responses' PSNs: each waits for its response.
                # Only the first response times the round trip (the others stream behind it),
                # so the rest are marked as Karn marks a retransmission: not timed.
                end = wr.first + wr.npkts
                for s in range(seq + 1, end):
                    self._out[s] = [self._txc, now, True]
                    self._lost_set.discard(s)
                if not retx:
                    self._reads_out += 1
                self.nxt = max(self.nxt, end)
                seq = end - 1
            self._txc += 1
            out.append(pkt)
            if ackreq:
                self._req_seq = max(self._req_seq, seq)
                if self.deadline is None or (retx and first == self.una and not self._rnr_wait):
                    # Only a packet that asked for an ACK is waiting for one; the others are
                    # covered by the next AckReq (coalescing must not look like loss). The
                    # oldest packet sent again restarts the clock (RFC 6298 5.3): the time
                    # it waited to go (a turn busy reading) is not the peer's silence.
                    self.deadline = now + self.rto
        return out

    def _wr_of(self, seq: int) -> _Wr:
        return self._wrs[bisect_right(self._firsts, seq, self._head) - 1]

    def _read_request(self, wr: _Wr, seq: int) -> tuple[bytes, bytes, bytes]:
        """A READ request for the WR's bytes from ``seq`` on (a retry starts at the first
        response missing, with the address and length moved on to match)."""
        off = (seq - wr.first) * self.cfg.mtu
        hdr = _BTH.pack(wire.READ_REQUEST, 0, wire.PKEY_DEFAULT, self.dqpn, (1 << 31) | self.psn(seq))
        return hdr + _RETH.pack(wr.remote_va + off, wr.rkey, len(wr.data) - off), b"", b""

    def _packet(self, wr: _Wr, seq: int, retx: bool) -> tuple[tuple[bytes, memoryview | bytes, bytes], bool]:
        i = seq - wr.first
        n = wr.npkts
        mtu = self.cfg.mtu
        base = _WRITE_BASE if wr.kind == "write" else _SEND_BASE
        imm = wr.imm is not None
        if n == 1:
            op = base + (_OP_ONLY_IMM if imm else _OP_ONLY)
        elif i == 0:
            op = base + _OP_FIRST
        elif i == n - 1:
            op = base + (_OP_LAST_IMM if imm else _OP_LAST)
        else:
            op = base + _OP_MIDDLE
        payload = wr.data[i * mtu:(i + 1) * mtu]
        pad = -len(payload) % 4
        last = i == n - 1
        ackreq = last or retx or seq % self.cfg.ackreq_every == 0 or len(self._out) + 1 >= self.cfg.max_inflight
        hdr = _BTH.pack(op, pad << 4, wire.PKEY_DEFAULT, self.dqpn, (ackreq << 31) | self.psn(seq))
        if i == 0 and wr.kind == "write":
            hdr += _RETH.pack(wr.remote_va, wr.rkey, len(wr.data))
        if last and imm:
            hdr += _IMM.pack(wr.imm)
        return (hdr, payload, _PAD[pad]), ackreq

    # --- requester: ACKs, NAKs, timer ---

    def _seq_of(self, psn: int) -> int:
        return self.una + psn_diff(psn, self.psn(self.una))

    def on_response(self, pkt: Packet, now: float) -> None:
        if pkt.bth.opcode != wire.ACKNOWLEDGE:
            self._on_read_response(pkt, now)
            return
        aeth = pkt.aeth
        high = self.nxt  # one past the highest packet ever sent (retransmissions come from below)
        seq = self._seq_of(pkt.bth.psn)
        syn = aeth.syndrome
        kind = syn >> 5
        if kind == 0:  # ACK: everything up to and including psn
            if not self.una - 1 <= seq < high:
                self.stats.drop("ack_out_of_window")
                return
            self.stats.acks_received += 1
            self._acked = max(self._acked, seq + 1)
            self._ack_through(self._reads_answered(seq + 1), now)
            return
        # NAKs carry the PSN the responder expects: everything before it arrived.
        if not self.una <= seq <= high:
            self.stats.drop("ack_out_of_window")
            return
        self.stats.naks_received += 1
        self._ack_through(self._reads_answered(seq), now)
        if self.error:
            return
        self.deadline = now + self.rto  # the responder is alive and answering: restart the clock
        if kind == 1:  # RNR NAK: the responder had no receive posted
            self._rnr_retries += 1
            self.stats.rnr_naks_received += 1
            if self.cfg.rnr_retry_limit != RNR_RETRY_FOREVER and self._rnr_retries > self.cfg.rnr_retry_limit:
                self._fail(RNR_RETRY_EXC_ERR)
                return
            self._hold_until = now + rnr_delay(syn)
            self._lose_from(seq)
            self._rnr_wait = True
            self.deadline = self._hold_until  # wake when the wait is over, to send again
        elif syn == wire.NAK_PSN_SEQUENCE_ERROR:
            if self.selective:
                self._on_sack(self._seq_of(aeth.msn), high, now)
            else:
                self._lose_from(seq)
        elif syn == wire.NAK_REMOTE_ACCESS_ERROR:
            self._fail(REM_ACCESS_ERR)
        elif syn == wire.NAK_REMOTE_OPERATIONAL_ERROR:
            self._fail(REM_OP_ERR)
        else:
            self._fail(REM_INV_REQ_ERR)

    def _reads_answered(self, new_una: int, go_back: bool = True) -> int:
        """How far an ACK may acknowledge: a READ is answered by its responses only, so an ACK
        past a READ whose responses have not all come means they were lost (IBTA 9.7.5.1.2's
        implicit NAK): the READ is asked again from its first missing response."""
        if not self._reads_out or new_una <= self.una:
            return new_una
        for i in range(self._head, len(self._wrs)):
            wr = self._wrs[i]
            if wr.first >= new_una:
                break
            if wr.kind == "read" and wr.first + wr.npkts > self.una:
                stop = max(self.una, wr.first)
                if go_back:
                    self._go_back(stop)
                return stop
        return new_una

    def _go_back(self, seq: int) -> None:
        """Resend from ``seq`` on, once per hole (the responses behind it keep coming)."""
        if self._gone_back != seq:
            self._gone_back = seq
            self._lose_from(seq)
            self._mark_lost(seq)  # the READ's request, if a SACK took it out of flight

    def _on_read_response(self, pkt: Packet, now: float) -> None:
        seq = self._seq_of(pkt.bth.psn)
        if not self.una <= seq < self.nxt:
            self.stats.drop("duplicate" if seq < self.una else "ack_out_of_window")
            return
        wr = self._wr_of(seq)
        if wr.kind != "read":
            self.stats.drop("unexpected_read_response")
            return
        if seq > self.una:
            # A response acknowledges every request before its READ (IBTA 9.7.5.1.2), unless
            # one of them is a READ still waiting for responses.
            before = self._reads_answered(wr.first)
            self._ack_through(before, now)
            if seq > self.una:  # a response of this READ (or an earlier one) was lost: ask again
                self.stats.drop("out_of_order")
                self._go_back(self.una)
                return
        i = seq - wr.first
        mtu = self.cfg.mtu
        want = min(mtu, len(wr.data) - i * mtu)
        last = i == wr.npkts - 1
        op = pkt.bth.opcode
        if len(pkt.payload) != want or last != (op in (wire.READ_RESPONSE_LAST, wire.READ_RESPONSE_ONLY)):
            self.stats.drop("bad_read_response")
            return
        wr.data[i * mtu:i * mtu + want] = pkt.payload
        self.stats.acks_received += 1
        self._ack_through(seq + 1, now)
        if self._acked > self.una:
            # An ACK came past this READ before its responses did: what it acknowledged
            # beyond the READ stands now (up to the next READ not answered yet).
            self._ack_through(self._reads_answered(self._acked, go_back=False), now)

    def _on_sack(self, sseq: int, high: int, now: float) -> None:
        if not self.una < sseq < high:
            return  # already covered by the cumulative ACK, or nonsense
        if self._wr_of(sseq).kind == "read":
            # A READ request held is not a READ answered: it stays in flight until its
            # responses come, but it got through, so what was sent well before it is lost.
            entry = self._out.get(sseq)
            if entry is not None:
                self._rack(entry[0])
            return
        entry = self._out.pop(sseq, None)
        self._lost_set.discard(sseq)
        if entry is None:
            return
        if not entry[2]:
            self._rtt_sample(now - entry[1])
        self._rack(entry[0])

    def _rack(self, delivered_txc: int) -> None:
        """RACK: whatever was sent well before a transmission that got through is lost."""
        limit = delivered_txc - self.cfg.reorder_window
        out = self._out
        while out:
            s, e = next(iter(out.items()))
            if e[0] >= limit:
                break
            del out[s]
            self._mark_lost(s)

    def _mark_lost(self, seq: int) -> None:
        if seq not in self._lost_set:
            self._lost_set.add(seq)
            heapq.heappush(self._lost, seq)

    def _lose_from(self, seq: int) -> None:
        """Go back: everything in flight from ``seq`` on is resent (skipping what is held)."""
        for s in [s for s in self._out if s >= seq]:
            del self._out[s]
            self._mark_lost(s)

    def _ack_through(self, new_una: int, now: float) -> None:
        if new_una <= self.una:
            return
        entry = self._out.get(new_una - 1)
        if entry is not None and not entry[2]:  # Karn: never time a retransmission
            self._rtt_sample(now - entry[1])
        latest = -1  # the latest transmission this ACK covers
        for s in range(self.una, new_una):
            e = self._out.pop(s, None)
            if e is not None and e[0] > latest:
                latest = e[0]
            self._lost_set.discard(s)
        self.una = new_una
        if self.selective and latest >= 0:
            # RACK: a retransmitted hole whose ACK drained the held packets behind it proves
            # the holes still outstanding from before it lost; without this, each of several
            # tail holes would cost a timeout of its own.
            self._rack(latest)
        self.nxt = max(self.nxt, new_una)
        self._retries = 0
        self._rnr_retries = 0
        self.rto = self._rto_from_rtt()
        # The clock runs while anything sent is unacknowledged (held packets included: their
        # cumulative ACK may be lost) and a packet that asked for an ACK is among it.
        self.deadline = now + self.rto if (self.una < self.nxt or self._lost_set) and self._req_seq >= new_una else None
        if self._rnr_wait and self._hold_until > now:
            self.deadline = self._hold_until
        # Complete every WR whose last packet is acknowledged.
        while self._head < len(self._wrs):
            wr = self._wrs[self._head]
            if wr.first + wr.npkts > new_una:
                break
            self._head += 1
            self.stats.bytes_acked += len(wr.data)
            if wr.kind == "read":
                self._reads_out -= 1
            if wr.signaled:
                self.send_cq.push(WorkCompletion(wr.wr_id, SUCCESS, wr.kind, self.qpn, len(wr.data)))
            wr.data = memoryview(b"")  # let the caller's buffer go
        if self._head > 4096:
            del self._wrs[:self._head], self._firsts[:self._head]
            self._head = 0

    def _rtt_sample(self, rtt: float) -> None:
        self.stats.rtt_samples += 1
        if self.srtt is None:
            self.srtt, self.rttvar = rtt, rtt / 2
        else:
            self.rttvar = 0.75 * self.rttvar + 0.25 * abs(self.srtt - rtt)
            self.srtt = 0.875 * self.srtt + 0.125 * rtt

    def _rto_from_rtt(self) -> float:
        if self.srtt is None:
            return self.cfg.rto_initial
        return min(self.cfg.rto_max, max(self.cfg.rto_min, self.srtt + 4 * self.rttvar))

    def on_timer(self, now: float) -> None:
        if self.deadline is None or now < self.deadline or self.error:
            return
        if self._rnr_wait:  # the RNR wait is over: send again, and time that out as usual
            self._rnr_wait = False
            self.deadline = now + self.rto
            return
        if self.una >= self.nxt and not self._lost_set:
            self.deadline = None
            return
        self._retries += 1
        self.stats.timeouts += 1
        if self._retries > self.cfg.retry_limit:
            self._fail(RETRY_EXC_ERR)
            return
        self.rto = min(self.cfg.rto_max, self.rto * 2)
        self._gone_back = -1
        if not self.selective:
            for s in list(self._out):
                self._mark_lost(s)
            self._out.clear()
        else:
            # Selective: resend only the oldest packet outstanding (the hole everything waits on);
            # what else is missing shows up in the SACKs its retransmission brings back.
            # Held packets (SACKed, not yet covered by a cumulative ACK) wait for it too: with
            # nothing in flight the oldest of them goes again, to bring the ACK back.
            oldest = min(self._out) if self._out else self.una if self.una < self.nxt else None
            if oldest is not None:
                self._out.pop(oldest, None)
                self._mark_lost(oldest)
        self.deadline = now + self.rto

    def _fail(self, status: str) -> None:
        """The QP goes to the error state: the WR at the head fails, the rest are flushed."""
        self.error = status
        self.deadline = None
        first = True
        for wr in self._wrs[self._head:]:
            self.send_cq.push(WorkCompletion(wr.wr_id, status if first else WR_FLUSH_ERR, wr.kind, self.qpn))
            first = False
        self._head = len(self._wrs)
        self._reads_out = 0
        self._out.clear()
        self._lost.clear()
        self._lost_set.clear()
        while self._recvs:
            self.recv_cq.push(WorkCompletion(self._recvs.popleft().wr_id, WR_FLUSH_ERR, "recv", self.qpn))

    # --- responder ---

    def on_request(self, pkt: Packet, now: float) -> None:
        psn = pkt.bth.psn
        d = psn_diff(psn, self.epsn)
        st = self.stats
        if d == 0:
            self._rnr_sent = False
            ackreq = pkt.bth.ackreq and pkt.bth.opcode != wire.READ_REQUEST
            if not self._execute(pkt):
                return
            drained = False
            held = self._held
            while held and self.epsn in held:
                p = held.pop(self.epsn)
                ackreq |= p.bth.ackreq and p.bth.opcode != wire.READ_REQUEST
                drained = True
                if not self._execute(p):
                    return
            # A READ's responses are its acknowledgement; an ACK after them covers the rest.
            if ackreq or (drained and self._last_op != wire.READ_REQUEST):
                self._send_ack()
            return
        if d > 0:
            if d >= self.cfg.rx_window:
                st.drop("psn_out_of_window")
                return
            if not self.selective:
                st.drop("out_of_order")
                if not self._nak_sent and not self._rnr_sent:
                    self._nak_sent = True
                    self._send_nak(wire.NAK_PSN_SEQUENCE_ERROR, self.epsn)
                return
            if psn in self._held:
                st.drop("duplicate")
            else:
                self._held[psn] = pkt
                st.held += 1
            st.sacks_sent += 1
            self._send_nak(wire.NAK_PSN_SEQUENCE_ERROR, self.epsn, msn=psn)
            return
        # Behind the expected PSN: a duplicate (a retransmission whose ACK was lost, or a replay).
        if -d > self.cfg.rx_window:
            st.drop("psn_out_of_window")
            return
        st.drop("duplicate")
        if pkt.bth.opcode == wire.READ_REQUEST:
            self._read(pkt, resend=True)  # its responses were lost: a READ can be answered again
        elif pkt.bth.ackreq:
            self._send_ack()

    def write_next(self, op: int, psn: int, ackreq: bool, body: memoryview) -> bool:
        """The common case of ``on_request`` without a parsed Packet: the PSN the responder
        expects, a WRITE_MIDDLE or WRITE_LAST (no immediate) of the WRITE being received, of a
        length it accepts, with nothing held behind it. True: carried out as on_request does it
        (``body`` is copied into the region at once); False: nothing changed, hand the packet
        to ``receive``, which decides (refuses, holds or NAKs) as for any other."""
        left = self._w_left
        if psn != self.epsn or self._held or self._w_buf is None or not left:
            return False
        n = len(body)
        last = op == _WRITE_BASE + _OP_LAST
        if (n != left) if last else (n != self.cfg.mtu or n >= left):
            return False
        self._rnr_sent = False
        self._last_op = op
        off = self._w_off
        self._w_buf[off:off + n] = body
        self._w_off = off + n
        self._w_left = left - n
        if last:
            self._w_buf = None
            self.msn = (self.msn + 1) % PSN_MOD
        self.epsn = (psn + 1) % PSN_MOD
        self._nak_sent = False
        self.stats.delivered += 1
        if ackreq:
            self._send_ack()
        return True

    def _execute(self, pkt: Packet) -> bool:
        """Carry out the packet the responder expects; False if it was refused (NAK sent)."""
        op = pkt.bth.opcode
        body = pkt.payload
        mtu = self.cfg.mtu
        self._last_op = op
        if op == wire.READ_REQUEST:
            n = self._read(pkt, resend=False)
            if n == 0:
                return False
            self.msn = (self.msn + 1) % PSN_MOD
            self.epsn = (self.epsn + n) % PSN_MOD
            self._nak_sent = False
            self.stats.delivered += 1
            return True
        if _WRITE_BASE <= op <= wire.WRITE_ONLY_IMM:
            step = op - _WRITE_BASE
            if step in (_OP_FIRST, _OP_ONLY, _OP_ONLY_IMM):
                reth = pkt.reth
                if self._w_left:
                    return self._refuse("invalid_request", wire.NAK_INVALID_REQUEST, pkt)
                try:
                    mr, off = self.pd.remote(reth.rkey, reth.va, reth.length, REMOTE_WRITE)
                except AccessError as e:
                    return self._refuse(e.reason, wire.NAK_REMOTE_ACCESS_ERROR, pkt)
                self._w_buf = memoryview(mr.buffer)[off:off + reth.length]
                self._w_off, self._w_left, self._w_len = 0, reth.length, reth.length
            elif self._w_buf is None or not self._w_left:
                return self._refuse("invalid_request", wire.NAK_INVALID_REQUEST, pkt)
            last = step in (_OP_LAST, _OP_LAST_IMM, _OP_ONLY, _OP_ONLY_IMM)
            if (not last and len(body) != mtu) or len(body) > self._w_left or (last and len(body) != self._w_left):
                self._w_buf, self._w_left = None, 0
                return self._refuse("bad_length", wire.NAK_INVALID_REQUEST, pkt)
            if step in (_OP_LAST_IMM, _OP_ONLY_IMM) and not self._recvs:
                return self._rnr(pkt)
            self._w_buf[self._w_off:self._w_off + len(body)] = body
            self._w_off += len(body)
            self._w_left -= len(body)
            if last:
                self._w_buf = None
                self.msn = (self.msn + 1) % PSN_MOD
                if pkt.imm is not None:
                    rwr = self._recvs.popleft()
                    self.recv_cq.push(WorkCompletion(rwr.wr_id, SUCCESS, "recv_rdma_with_imm", self.qpn,
                                                     self._w_len, pkt.imm))
        elif _SEND_BASE <= op <= wire.SEND_ONLY_IMM:
            step = op - _SEND_BASE
            if step in (_OP_FIRST, _OP_ONLY, _OP_ONLY_IMM):
                if self._r_wr is not None:
                    return self._refuse("invalid_request", wire.NAK_INVALID_REQUEST, pkt)
                if not self._recvs:
                    return self._rnr(pkt)
                self._r_wr, self._r_off = self._recvs.popleft(), 0
            elif self._r_wr is None:
                return self._refuse("invalid_request", wire.NAK_INVALID_REQUEST, pkt)
            last = step in (_OP_LAST, _OP_LAST_IMM, _OP_ONLY, _OP_ONLY_IMM)
            rwr = self._r_wr
            if (not last and len(body) != mtu) or self._r_off + len(body) > len(rwr.buf):
                self._r_wr = None
                self.recv_cq.push(WorkCompletion(rwr.wr_id, LOC_LEN_ERR, "recv", self.qpn, self._r_off))
                return self._refuse("bad_length", wire.NAK_INVALID_REQUEST, pkt)
            rwr.buf[self._r_off:self._r_off + len(body)] = body
            self._r_off += len(body)
            if last:
                self._r_wr = None
                self.msn = (self.msn + 1) % PSN_MOD
                self.recv_cq.push(WorkCompletion(rwr.wr_id, SUCCESS, "recv", self.qpn, self._r_off, pkt.imm))
        else:
            # Responses, CNPs and anything else a requester may not send us.
            return self._refuse("unsupported_opcode", wire.NAK_INVALID_REQUEST, pkt)
        self.epsn = (self.epsn + 1) % PSN_MOD
        self._nak_sent = False
        self.stats.delivered += 1
        return True

    def _refuse(self, reason: str, syndrome: int, pkt: Packet) -> bool:
        self.stats.drop(reason)
        self._send_nak(syndrome, pkt.bth.psn)
        return False

    def _rnr(self, pkt: Packet) -> bool:
        self.stats.drop("rnr")
        self._rnr_sent = True
        self._send_nak(wire.AETH_RNR_NAK | self.cfg.min_rnr_timer, pkt.bth.psn)
        return False

    def _read(self, pkt: Packet, resend: bool) -> int:
        """Answer a READ request: its bytes in responses of one MTU each, PSNs from the
        request's, AETH on the first and last; the number of PSNs it takes (0: refused)."""
        reth = pkt.reth
        try:
            mr, off = self.pd.remote(reth.rkey, reth.va, reth.length, REMOTE_READ)
        except AccessError as e:
            if resend:
                self.stats.drop(e.reason)
                return 0
            return int(self._refuse(e.reason, wire.NAK_REMOTE_ACCESS_ERROR, pkt))
        mtu = self.cfg.mtu
        n = max(1, -(-reth.length // mtu))
        if n > self.cfg.rx_window:
            return int(self._refuse("bad_length", wire.NAK_INVALID_REQUEST, pkt))
        data = memoryview(mr.buffer)[off:off + reth.length]
        psn = pkt.bth.psn
        msn = (self.msn + (0 if resend else 1)) % PSN_MOD
        for i in range(n):
            body = data[i * mtu:(i + 1) * mtu]
            pad = -len(body) % 4
            if n == 1:
                op = wire.READ_RESPONSE_ONLY
            else:
                op = (wire.READ_RESPONSE_FIRST if i == 0 else wire.READ_RESPONSE_LAST if i == n - 1
                      else wire.READ_RESPONSE_MIDDLE)
            hdr = _BTH.pack(op, pad << 4, wire.PKEY_DEFAULT, self.dqpn, (psn + i) % PSN_MOD)
            if op != wire.READ_RESPONSE_MIDDLE:
                hdr += wire.AETH_STRUCT.pack(_AETH_ACK | msn)
            self.outbox.append([hdr, body, _PAD[pad]])
        self.stats.read_responses += n
        return n

    def _send_ack(self) -> None:
        self.stats.acks_sent += 1
        self.outbox.append([_ACK.pack(wire.ACKNOWLEDGE, 0, wire.PKEY_DEFAULT, self.dqpn, (self.epsn - 1) % PSN_MOD,
                                      _AETH_ACK | self.msn)])

    def _send_nak(self, syndrome: int, psn: int, msn: int | None = None) -> None:
        self.stats.naks_sent += 1
        self.outbox.append([_ACK.pack(wire.ACKNOWLEDGE, 0, wire.PKEY_DEFAULT, self.dqpn, psn,
                                      (syndrome << 24) | (self.msn if msn is None else msn))])

    # --- both ---

    def receive(self, pkt: Packet, now: float) -> None:
        """A packet parsed and addressed to this QP."""
        op = pkt.bth.opcode
        if op == wire.ACKNOWLEDGE or wire.READ_RESPONSE_FIRST <= op <= wire.READ_RESPONSE_ONLY:
            self.on_response(pkt, now)
        elif op == wire.CNP:
            if self.rp is None:
                self.stats.drop("cnp_ignored")  # no rate control on this QP (DCQCN off)
            else:
                self.stats.cnps_received += 1
                self.rp.on_cnp(now)
        else:
            self.on_request(pkt, now)


__all__ = ["QueuePair", "QpConfig", "CompletionQueue", "WorkCompletion", "Aeth", "MODES"]
