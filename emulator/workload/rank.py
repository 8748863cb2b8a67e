"""One rank of a collective on a soft-NIC: it carries out its share of a schedule
(workload.collectives) over RC queue pairs, as NCCL's IB transport does.

- Every directed link of the schedule (this rank to a peer it sends to) has ``qps`` QP pairs;
  each message (a part of one channel at one step) is split over them, each share an RDMA
  WRITE_WITH_IMM whose immediate names the message, so the receiver learns it is complete when
  every share's completion has come (NCCL_IB_QPS_PER_CONNECTION splits a message the same way).
- The receiver gives each link a staging region with a slot for every message the link will
  carry, so nothing is overwritten while it is still needed, and posts one receive per share.
- Each channel goes step by step: post this rank's sends of the step (what the rank holds after
  the steps before it, copied, since a retransmission reads its source again), then wait for the
  messages the step brings and reduce or store them. Channels progress independently.
- With receiver-driven admission (``admission`` = w > 0, Meta's clear-to-send, SIGCOMM 2024) a
  sender writes a message only once its receiver has cleared it: the receiver clears a link's
  message of step k when its own channel has reached step k - w + 1, with a zero-byte SEND whose
  immediate names the slot, on the link's first QP (RC QPs carry both ways). So no more than w
  messages per link are ever in flight or queued towards a receiver, whatever the fabric's
  congestion control, and each cleared step costs the receiver-to-sender latency unless w covers it.
The rank never blocks: ``progress()`` does what can be done now and says whether all is done,
so the NIC's loop drives it (``SoftNic.run(rank.progress, ...)``).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from emulator.nic.rc import QpConfig, SUCCESS
from emulator.workload import collectives as C
from emulator.workload.records import FlowEndpoint, QpEndpoint


@dataclass(frozen=True)
class RankReady:
    """What a rank tells the others to connect: per peer it sends to, its QPs; per peer it
    receives from, its QPs and the staging region that peer writes into (a transfer's target
    flow, records.FlowEndpoint). Keys are the peers' ranks."""

    rank: int
    out: dict[int, list[QpEndpoint]]
    inbound: dict[int, FlowEndpoint]

    @classmethod
    def from_dict(cls, d: dict) -> "RankReady":
        return cls(d["rank"], {int(k): [QpEndpoint(**q) for q in v] for k, v in d["out"].items()},
                   {int(k): FlowEndpoint.from_dict(v) for k, v in d["inbound"].items()})


@dataclass
class RankFigures:
    """What one rank measured, in the NIC's wall seconds."""

    rank: int
    ok: bool
    seconds: float | None
    sent_bytes: int
    received_bytes: int
    failed: list[dict] = field(default_factory=list)


def _shares(nbytes: int, ways: int) -> list[tuple[int, int]]:
    """``nbytes`` cut into at most ``ways`` word-aligned (offset, length) shares, none empty."""
    words = nbytes // C.WORD
    ways = max(1, min(ways, words))
    base, extra = divmod(words, ways)
    out, off = [], 0
    for i in range(ways):
        n = (base + (1 if i < extra else 0)) * C.WORD
        out.append((off, n))
        off += n
    return out


class Rank:
    """Rank ``rank`` of the collective laid out by ``lay``, on ``nic``; ``ips[i]`` is rank i's
    address. ``data`` is this rank's input (``lay.input_words()`` uint32 words)."""

    def __init__(self, nic, lay: C.Layout, rank: int, data: np.ndarray, ips: list[str], qps: int = 1,
                 config: QpConfig | None = None, initial_psn=lambda: 0, admission: int = 0) -> None:
        if len(ips) != lay.ranks:
            raise C.CollectiveError(f"{len(ips)} addresses for {lay.ranks} ranks")
        if admission < 0:
            raise C.CollectiveError(f"admission window {admission}: 0 (none) or more messages per link")
        self.admission = admission
        self.nic, self.lay, self.rank = nic, lay, rank
        sends = C.schedule(lay)
        self.mine = [s for s in sends if s.src == rank]
        self.incoming = [s for s in sends if s.dst == rank]
        self.n_steps = C.steps(sends)
        # A message's slot on its link: its place among the link's messages, in schedule order.
        self.slot: dict[C.Send, int] = {}
        for link in {(s.src, s.dst) for s in sends if rank in (s.src, s.dst)}:
            for i, s in enumerate(x for x in sends if (x.src, x.dst) == link):
                self.slot[s] = i
        part = lay.part_bytes
        self.ways = len(_shares(part, qps))
        self.out = {d: [nic.create_qp(ips[d], config, initial_psn=initial_psn()) for _ in range(self.ways)]
                    for d in sorted({s.dst for s in self.mine})}
        self.inq = {s: [nic.create_qp(ips[s], config, initial_psn=initial_psn()) for _ in range(self.ways)]
                    for s in sorted({s.src for s in self.incoming})}
        self.n_msgs = {src: sum(1 for s in self.incoming if s.src == src) for src in self.inq}
        self.n_out = {dst: sum(1 for s in self.mine if s.dst == dst) for dst in self.out}
        self.staging = {src: nic.pd.register(bytearray(n * part)) for src, n in self.n_msgs.items()}
        self.qp_src = {q.qpn: src for src, qs in self.inq.items() for q in qs}
        self.peers: dict[int, RankReady] = {}
        self.failed: list[dict] = []
        self.sent_bytes = self.received_bytes = 0
        self.restart(data)

    def restart(self, data: np.ndarray) -> None:
        """Begin the collective (again) on ``data``: receives posted for every share of every
        message the rank will get. Only once every rank has ended the last run: a run reuses
        the links' slots and immediates."""
        self.buf = C.working(self.lay, self.rank, np.asarray(data, dtype=np.uint32))
        for src, qs in self.inq.items():
            for q in qs:
                for i in range(self.n_msgs[src]):
                    q.post_recv(i, bytearray(0))
        if self.admission:
            for dst, qs in self.out.items():  # the receivers' clear-to-send
                for i in range(self.n_out[dst]):
                    qs[0].post_recv(i, bytearray(0))
        self.arrived: dict[tuple[int, int], int] = {}  # (src, slot) -> shares complete
        self.cleared: set[tuple[int, int]] = set()  # (dst, slot) its receiver has cleared
        self.granted: set[C.Send] = set()  # incoming messages this rank has cleared
        self.cur = [0] * self.lay.channels  # each channel's step
        self.posted: set[tuple[int, int]] = set()  # (step, channel) whose sends are posted
        self.pending = 0  # sends posted and not yet completed

    def ready(self) -> RankReady:
        ep = lambda qs: [QpEndpoint(q.qpn, q.ipsn, q.offers_sack) for q in qs]  # noqa: E731
        return RankReady(self.rank, {d: ep(qs) for d, qs in self.out.items()},
                         {s: FlowEndpoint(ep(qs), self.staging[s].rkey, self.staging[s].va) for s, qs in self.inq.items()})

    def connect(self, peers: list[RankReady]) -> None:
        by_rank = {p.rank: p for p in peers}
        for d, qs in self.out.items():
            theirs = by_rank[d].inbound[self.rank]
            for q, e in zip(qs, theirs.qps):
                q.connect(e.qpn, e.psn, sack=e.sack)
        for s, qs in self.inq.items():
            for q, e in zip(qs, by_rank[s].out[self.rank]):
                q.connect(e.qpn, e.psn, sack=e.sack)
        self.peers = by_rank

    def _part(self, buf: np.ndarray, channel: int, part: int) -> np.ndarray:
        return C.parts(self.lay, buf)[channel, part]

    def _clear(self) -> None:
        """Send the clear-to-send of every incoming message now within the admission window."""
        for s in self.incoming:
            if s not in self.granted and s.step < self.cur[s.channel] + self.admission:
                self.inq[s.src][0].post_send(self.slot[s], b"", imm=self.slot[s])
                self.granted.add(s)
                self.pending += 1

    def _may_post(self, step: int, channel: int) -> bool:
        return not self.admission or all((s.dst, self.slot[s]) in self.cleared for s in self.mine
                                         if s.step == step and s.channel == channel)

    def _post(self, step: int, channel: int) -> None:
        for s in (x for x in self.mine if x.step == step and x.channel == channel):
            data = self._part(self.buf, channel, s.src_part).tobytes()  # the source stays as posted
            dst = self.peers[s.dst].inbound[self.rank]
            base = dst.va + self.slot[s] * self.lay.part_bytes
            for q, (off, n) in zip(self.out[s.dst], _shares(len(data), self.ways)):
                q.post_write(self.slot[s], memoryview(data)[off:off + n], base + off, dst.rkey, imm=self.slot[s])
                self.pending += 1
            self.sent_bytes += len(data)
        self.posted.add((step, channel))

    def _poll(self) -> None:
        for qs in (*self.out.values(), *self.inq.values()):
            for q in qs:
                for wc in q.send_cq.poll():
                    self.pending -= 1
                    if wc.status != SUCCESS:
                        self.failed.append({"qpn": q.qpn, "wr_id": wc.wr_id, "status": wc.status})
        if self.admission:
            for dst, qs in self.out.items():
                for wc in qs[0].recv_cq.poll():
                    if wc.status != SUCCESS or wc.imm is None:
                        self.failed.append({"qpn": qs[0].qpn, "wr_id": wc.wr_id, "status": wc.status})
                    else:
                        self.cleared.add((dst, wc.imm))
        for qs in self.inq.values():
            for q in qs:
                for wc in q.recv_cq.poll():
                    if wc.status != SUCCESS or wc.imm is None:
                        self.failed.append({"qpn": q.qpn, "wr_id": wc.wr_id, "status": wc.status})
                        continue
                    key = (self.qp_src[q.qpn], wc.imm)
                    self.arrived[key] = self.arrived.get(key, 0) + 1

    def _apply(self, step: int, channel: int) -> bool:
        """Reduce or store the messages of (step, channel) once all have come; False if not yet."""
        msgs = [s for s in self.incoming if s.step == step and s.channel == channel]
        if any(self.arrived.get((s.src, self.slot[s]), 0) < self.ways for s in msgs):
            return False
        part = self.lay.part_bytes
        for s in msgs:
            at = self.slot[s] * part
            got = np.frombuffer(self.staging[s.src].buffer, dtype=np.uint32, count=self.lay.part_words,
                                offset=at)
            mine = self._part(self.buf, channel, s.dst_part)
            if s.reduce:
                mine += got  # uint32: modulo 2^32
            else:
                mine[:] = got
            self.received_bytes += part
        return True

    def progress(self) -> bool:
        """Do what can be done now; True once the rank has its result and every send is
        acknowledged, or once something failed (``failed`` says what)."""
        self._poll()
        if self.admission:
            self._clear()
        for ch in range(self.lay.channels):
            while self.cur[ch] < self.n_steps and not self.failed:
                k = self.cur[ch]
                if (k, ch) not in self.posted:
                    if not self._may_post(k, ch):
                        break
                    self._post(k, ch)
                if not self._apply(k, ch):
                    break
                self.cur[ch] += 1
                if self.admission:
                    self._clear()
        return bool(self.failed) or (self.done and self.pending == 0)

    @property
    def done(self) -> bool:
        return all(k >= self.n_steps for k in self.cur)

    def result(self) -> np.ndarray:
        return C.result_of(self.lay, self.rank, self.buf)
