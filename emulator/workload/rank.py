"""One rank of a collective on a soft-NIC: it carries out its share of a schedule
(workload.collectives) over RC queue pairs, as NCCL's IB transport does.

- Every directed link of the schedule (this rank to a peer it sends to) has ``qps`` QP pairs.
  Each message (a part of one channel at one step) is cut into chunks of about ``chunk`` bytes,
  dealt round the link's QPs in turn, each chunk an RDMA WRITE_WITH_IMM whose immediate names the
  message and the chunk (NCCL pipelines a step's message in chunks over the connection's QPs).
- The receiver gives each link a staging region with a slot for every message the link will
  carry, so nothing is overwritten while it is still needed, and posts one receive per chunk.
- A chunk is a column of the schedule: slice c of every part goes through the steps on its own,
  as the same collective on smaller parts would. So chunk c of step k is sent as soon as chunk c
  of step k - 1 has come and been reduced, while the other chunks are still on the wire: the
  NIC's line does not wait for a whole message to be reduced and copied. Channels progress
  independently too; the sends of a step read what the rank held before the step (copied when
  posted, since a retransmission reads its source again).
- ``progress()`` does at most ``work`` bytes of copying and reducing per call and says (``busy``)
  when it stopped with more to do: the NIC's loop reads what came in and sends between calls, so
  reducing a large message never holds its ACKs back for milliseconds.
- With receiver-driven admission (``admission`` = w > 0, Meta's clear-to-send, SIGCOMM 2024) a
  sender writes a message only once its receiver has cleared it: the receiver clears a link's
  message of step k when every chunk of its channel has reached step k - w + 1, with a zero-byte
  SEND whose immediate names the slot, on the link's first QP (RC QPs carry both ways). So no more
  than w messages per link are ever in flight or queued towards a receiver, whatever the fabric's
  congestion control, and each cleared step costs the receiver-to-sender latency unless w covers it.
The rank never blocks: ``progress()`` does what can be done now and says whether all is done,
so the NIC's loop drives it (``SoftNic.run(rank.progress, ..., busy=lambda: rank.busy)``).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from emulator.nic.rc import QpConfig, SUCCESS
from emulator.workload import collectives as C
from emulator.workload.limits import CHUNK_BYTES
from emulator.workload.records import FlowEndpoint, QpEndpoint


# Bytes copied or reduced per progress() call before the NIC's loop gets its turn again: about a
# millisecond of numpy on these machines.
WORK_BYTES = 1 << 20


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
                 config: QpConfig | None = None, initial_psn=lambda: 0, admission: int = 0,
                 chunk: int = CHUNK_BYTES, work: int = WORK_BYTES) -> None:
        if len(ips) != lay.ranks:
            raise C.CollectiveError(f"{len(ips)} addresses for {lay.ranks} ranks")
        if admission < 0:
            raise C.CollectiveError(f"admission window {admission}: 0 (none) or more messages per link")
        if chunk < C.WORD or work < 1:
            raise C.CollectiveError(f"chunk {chunk} B, work {work} B: a chunk holds at least one word")
        self.admission = admission
        self.work = work
        self.nic, self.lay, self.rank = nic, lay, rank
        sends = C.schedule(lay)
        self.mine = [s for s in sends if s.src == rank]
        self.incoming = [s for s in sends if s.dst == rank]
        self.n_steps = C.steps(sends)
        self._mine_at: dict[tuple[int, int], list[C.Send]] = {}
        self._incoming_at: dict[tuple[int, int], list[C.Send]] = {}
        for x in self.mine:
            self._mine_at.setdefault((x.step, x.channel), []).append(x)
        for x in self.incoming:
            self._incoming_at.setdefault((x.step, x.channel), []).append(x)
        # A message's slot on its link: its place among the link's messages, in schedule order.
        self.slot: dict[C.Send, int] = {}
        for link in {(s.src, s.dst) for s in sends if rank in (s.src, s.dst)}:
            for i, s in enumerate(x for x in sends if (x.src, x.dst) == link):
                self.slot[s] = i
        self._in_slot = {(s.src, self.slot[s]): s for s in self.incoming}
        self._out_slot = {(s.dst, self.slot[s]): s for s in self.mine}
        part = lay.part_bytes
        self.ways = min(qps, lay.part_words)
        # Chunks of a part: at least one per QP, whole rounds of the QPs where the part allows.
        n = max(self.ways, -(-part // chunk))
        n = min(lay.part_words, -(-n // self.ways) * self.ways)
        self.chunks = _shares(part, n)
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
        """Begin the collective (again) on ``data``: receives posted for every chunk of every
        message the rank will get. Only once every rank has ended the last run: a run reuses
        the links' slots and immediates."""
        self.buf = C.working(self.lay, self.rank, np.asarray(data, dtype=np.uint32))
        self._parts = C.parts(self.lay, self.buf)
        per_qp = [len(range(q, len(self.chunks), self.ways)) for q in range(self.ways)]
        for src, qs in self.inq.items():
            for q, k in zip(qs, per_qp):
                for i in range(self.n_msgs[src] * k):
                    q.post_recv(i, bytearray(0))
        if self.admission:
            for dst, qs in self.out.items():  # the receivers' clear-to-send
                for i in range(self.n_out[dst]):
                    qs[0].post_recv(i, bytearray(0))
        self.arrived: set[tuple[int, int]] = set()  # (src, immediate): chunks that have come
        self.cleared: set[tuple[int, int]] = set()  # (dst, slot) its receiver has cleared
        self.granted: set[C.Send] = set()  # incoming messages this rank has cleared
        n = len(self.chunks)
        self.col = [[0] * n for _ in range(self.lay.channels)]  # each chunk's step
        # Chunks per channel at each step, and the lowest step one is at: the channel's step.
        self._at = [[n] + [0] * self.n_steps for _ in range(self.lay.channels)]
        self._low = [0] * self.lay.channels
        # The chunks something happened to (data came, a clearance, the start), in that order:
        # only these can go on, so a call looks at nothing else.
        self._todo: dict[tuple[int, int], None] = {(ch, c): None for ch in range(self.lay.channels)
                                                   for c in range(n)}
        self.posted: set[tuple[int, int]] = set()  # (step, channel) whose sends have begun
        self._posted: set[tuple[int, int, int]] = set()  # (step, channel, chunk) posted
        self.pending = 0  # sends posted and not yet completed
        self.busy = True  # progress() left work it could do now

    @property
    def cur(self) -> list[int]:
        """Each channel's step: the step its slowest chunk is at."""
        return list(self._low)

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

    def _imm(self, s: C.Send, c: int) -> int:
        return self.slot[s] * len(self.chunks) + c

    def _clear(self) -> None:
        """Send the clear-to-send of every incoming message now within the admission window."""
        cur = self._low
        for s in self.incoming:
            if s not in self.granted and s.step < cur[s.channel] + self.admission:
                self.inq[s.src][0].post_send(self.slot[s], b"", imm=self.slot[s])
                self.granted.add(s)
                self.pending += 1

    def _may_post(self, step: int, channel: int) -> bool:
        return not self.admission or all((s.dst, self.slot[s]) in self.cleared
                                         for s in self._mine_at.get((step, channel), ()))

    def _post(self, step: int, channel: int, c: int) -> int:
        """Write chunk ``c`` of this rank's messages of (step, channel); the bytes copied."""
        off, n = self.chunks[c]
        moved = 0
        for s in self._mine_at.get((step, channel), ()):
            part = self._parts[channel, s.src_part]
            data = part[off // C.WORD:(off + n) // C.WORD].tobytes()  # the source stays as posted
            dst = self.peers[s.dst].inbound[self.rank]
            q = self.out[s.dst][c % self.ways]
            q.post_write(self._imm(s, c), data, dst.va + self.slot[s] * self.lay.part_bytes + off, dst.rkey,
                         imm=self._imm(s, c))
            self.pending += 1
            self.sent_bytes += n
            moved += n
        self.posted.add((step, channel))
        self._posted.add((step, channel, c))
        return moved

    def _poll(self) -> None:
        """Take in the completions; the chunks data or a clearance came for are to be looked at."""
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
                        s = self._out_slot.get((dst, wc.imm))
                        if s is not None:  # every chunk of its channel that waits on it
                            self._todo.update(((s.channel, c), None) for c in range(len(self.chunks)))
        for qs in self.inq.values():
            for q in qs:
                for wc in q.recv_cq.poll():
                    if wc.status != SUCCESS or wc.imm is None:
                        self.failed.append({"qpn": q.qpn, "wr_id": wc.wr_id, "status": wc.status})
                    else:
                        src = self.qp_src[q.qpn]
                        self.arrived.add((src, wc.imm))
                        s = self._in_slot.get((src, wc.imm // len(self.chunks)))
                        if s is not None:
                            self._todo[(s.channel, wc.imm % len(self.chunks))] = None

    def _apply(self, step: int, channel: int, c: int) -> int | None:
        """Reduce or store chunk ``c`` of the messages of (step, channel) once all have come: the
        bytes it took, None if not yet."""
        msgs = self._incoming_at.get((step, channel), ())
        if any((s.src, self._imm(s, c)) not in self.arrived for s in msgs):
            return None
        off, n = self.chunks[c]
        for s in msgs:
            at = self.slot[s] * self.lay.part_bytes + off
            got = np.frombuffer(self.staging[s.src].buffer, dtype=np.uint32, count=n // C.WORD, offset=at)
            mine = self._parts[channel, s.dst_part][off // C.WORD:(off + n) // C.WORD]
            if s.reduce:
                mine += got  # uint32: modulo 2^32
            else:
                mine[:] = got
            self.received_bytes += n
        return n * len(msgs)

    def _advance(self, ch: int, c: int) -> int | None:
        """One thing chunk ``c`` of channel ``ch`` can do now (post its sends of its step, or
        take in what the step brought and go to the next): the bytes it moved, None if nothing."""
        k = self.col[ch][c]
        if k >= self.n_steps:
            return None
        if (k, ch, c) not in self._posted:
            if not self._may_post(k, ch):
                return None
            return self._post(k, ch, c)
        took = self._apply(k, ch, c)
        if took is not None:
            self.col[ch][c] = k + 1
            at = self._at[ch]
            at[k] -= 1
            at[k + 1] += 1
            if k == self._low[ch] and not at[k]:
                while self._low[ch] < self.n_steps and not at[self._low[ch]]:
                    self._low[ch] += 1
                if self.admission:
                    self._clear()
        return took

    def progress(self) -> bool:
        """Do what can be done now, at most ``work`` bytes of it (``busy`` says whether more
        could be done at once); True once the rank has its result and every send is
        acknowledged, or once something failed (``failed`` says what)."""
        self._poll()
        if self.admission:
            self._clear()
        budget = self.work
        # Each chunk something happened to goes as far as it can: chunk c of a step is reduced
        # and its next step's sends posted at once, while the other chunks are on the wire.
        while self._todo and not self.failed:
            key = next(iter(self._todo))
            while (took := self._advance(*key)) is not None:
                budget -= max(took, 1)
                if budget <= 0:
                    break
            if took is None:
                del self._todo[key]
            if budget <= 0:
                break
        self.busy = bool(self._todo) and not self.failed
        return bool(self.failed) or (self.done and self.pending == 0)

    @property
    def done(self) -> bool:
        return all(low >= self.n_steps for low in self._low)

    def result(self) -> np.ndarray:
        return C.result_of(self.lay, self.rank, self.buf)
