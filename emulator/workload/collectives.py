"""Collectives as NCCL's ring and point-to-point algorithms run them, as pure data: which rank
sends which part of its buffer to which rank at each step, and whether the receiver adds it to
what it holds (reduce) or keeps it (copy). The soft-NIC workers carry out a schedule over their
QPs; ``execute`` carries it out in memory, so a schedule is checked against what the operation
means (``expected``) and an emulated run's result against the schedule's.

Buffers are arrays of 32-bit unsigned words summed modulo 2^32: a reduction that is exact in any
order, so a result is right or wrong to the bit (floating-point sums would depend on the order).

Sizes follow nccl-tests (its PERFORMANCE.md): ``size`` is the largest buffer of the operation,
the all-reduce's buffer, the all-gather's output, the reduce-scatter's input and each rank's
all-to-all buffer; algbw = size / time, busbw = algbw x ``BUSBW_FACTOR[op](n)``, which makes
busbw comparable with the link's rate whatever the operation and the number of ranks.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from emulator.workload.limits import OPS

WORD = 4  # bytes of one element (uint32)

# nccl-tests' busbw factors: the share of the buffer each rank's link must carry, per byte of
# ``size``, in the best algorithm (a ring moves 2(n-1)/n of an all-reduce's buffer in and out).
BUSBW_FACTOR: dict[str, Callable[[int], float]] = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
}


class CollectiveError(ValueError):
    """A collective that cannot be laid out: unknown operation, too few ranks, a size that does
    not split into the ranks' parts."""


@dataclass(frozen=True)
class Send:
    """One message of a collective: at ``step``, rank ``src`` sends its part ``src_part`` (of
    channel ``channel``) to rank ``dst``, which adds it to its part ``dst_part`` (reduce) or
    stores it there (copy). Every send of a step reads what its sender held before the step."""

    step: int
    channel: int
    src: int
    dst: int
    src_part: int
    dst_part: int
    reduce: bool


@dataclass(frozen=True)
class Layout:
    """How an operation's buffers are cut: ``channels`` independent rings (NCCL's channels, each
    on its own QPs), each over ``ranks`` parts of ``part_words`` words. ``words`` is what each
    rank's working buffer holds: channels x ranks x part_words."""

    op: str
    ranks: int
    channels: int
    part_words: int

    @property
    def words(self) -> int:
        return self.channels * self.ranks * self.part_words

    @property
    def size(self) -> int:
        """The operation's size in nccl-tests' sense (bytes)."""
        return self.words * WORD

    @property
    def part_bytes(self) -> int:
        return self.part_words * WORD

    def input_words(self) -> int:
        """Words each rank contributes."""
        return self.words // self.ranks if self.op == "all_gather" else self.words

    def output_words(self) -> int:
        """Words each rank ends with."""
        return self.words // self.ranks if self.op == "reduce_scatter" else self.words


def layout(op: str, size: int, ranks: int, channels: int = 1) -> Layout:
    """The layout of ``op`` of ``size`` bytes over ``ranks`` ranks and ``channels`` channels;
    ``size`` is rounded down to whole parts, as nccl-tests rounds its counts (the layout's
    ``size`` is what really moves)."""
    if op not in OPS:
        raise CollectiveError(f"unknown collective {op!r}: one of {', '.join(OPS)}")
    if ranks < 2:
        raise CollectiveError(f"a collective needs at least 2 ranks, not {ranks}")
    if channels < 1:
        raise CollectiveError(f"channels must be at least 1, not {channels}")
    part_words = size // (WORD * ranks * channels)
    if part_words < 1:
        raise CollectiveError(f"{size} B does not split into {ranks} ranks x {channels} channels of "
                              f"{WORD}-byte words: at least {WORD * ranks * channels} B")
    return Layout(op, ranks, channels, part_words)


def _ring_phase(lay: Layout, first_step: int, shift: int, reduce: bool) -> list[Send]:
    """n-1 steps of a ring: at step s rank r sends part (r - s + shift) mod n to rank r + 1,
    which forwards it (with its own added, when reducing) at the next step."""
    n = lay.ranks
    out = []
    for s in range(n - 1):
        for ch in range(lay.channels):
            for r in range(n):
                part = (r - s + shift) % n
                out.append(Send(first_step + s, ch, r, (r + 1) % n, part, part, reduce))
    return out


def schedule(lay: Layout) -> tuple[Send, ...]:
    """Every send of the operation, in step order.
      - reduce_scatter: a ring of n-1 steps after which rank r holds the sum of part r;
      - all_gather: a ring of n-1 steps after which every rank holds every rank's part;
      - all_reduce: the two, 2(n-1) steps, as NCCL's ring all-reduce;
      - all_to_all: one step, rank r sending its part j to rank j's part r (point to point)."""
    if lay.op == "reduce_scatter":
        return tuple(_ring_phase(lay, 0, -1, True))
    if lay.op == "all_gather":
        return tuple(_ring_phase(lay, 0, 0, False))
    if lay.op == "all_reduce":
        return tuple(_ring_phase(lay, 0, -1, True) + _ring_phase(lay, lay.ranks - 1, 0, False))
    return tuple(Send(0, ch, r, j, j, r, False) for ch in range(lay.channels)
                 for r in range(lay.ranks) for j in range(lay.ranks) if j != r)


def steps(sends: Sequence[Send]) -> int:
    return max((s.step for s in sends), default=-1) + 1


def parts(lay: Layout, buf: np.ndarray) -> np.ndarray:
    """A rank's working buffer viewed as [channel, part, word]."""
    return buf.reshape(lay.channels, lay.ranks, lay.part_words)


def working(lay: Layout, rank: int, data: np.ndarray) -> np.ndarray:
    """The buffer rank ``rank`` works in, its input placed where the schedule expects it."""
    if lay.op != "all_gather":
        return data.astype(np.uint32, copy=True)
    buf = np.zeros(lay.words, dtype=np.uint32)
    # Its input is its own part of each channel's slice of the output.
    parts(lay, buf)[:, rank, :] = data.reshape(lay.channels, lay.part_words)
    return buf


def result_of(lay: Layout, rank: int, buf: np.ndarray) -> np.ndarray:
    if lay.op != "reduce_scatter":
        return buf
    return parts(lay, buf)[:, rank, :].reshape(-1).copy()


def execute(lay: Layout, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Carry out the schedule in memory: each rank's output from every rank's input."""
    if len(inputs) != lay.ranks:
        raise CollectiveError(f"{len(inputs)} inputs for {lay.ranks} ranks")
    for r, x in enumerate(inputs):
        if x.size != lay.input_words():
            raise CollectiveError(f"rank {r}'s input has {x.size} words, the layout wants {lay.input_words()}")
    bufs = [working(lay, r, x) for r, x in enumerate(inputs)]
    sends = schedule(lay)
    for step in range(steps(sends)):
        now = [s for s in sends if s.step == step]
        # What each sender holds before the step, so that a step's sends never see each other.
        sent = [parts(lay, bufs[s.src])[s.channel, s.src_part].copy() for s in now]
        for s, data in zip(now, sent):
            dst = parts(lay, bufs[s.dst])[s.channel]
            if s.reduce:
                dst[s.dst_part] += data  # uint32: wraps modulo 2^32
            else:
                dst[s.dst_part] = data
    return [result_of(lay, r, b) for r, b in enumerate(bufs)]


def expected(lay: Layout, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """What the operation means, computed directly (no schedule)."""
    n = lay.ranks
    xs = [np.asarray(x, dtype=np.uint32) for x in inputs]
    if lay.op == "all_reduce":
        total = np.sum(np.stack(xs), axis=0, dtype=np.uint32)
        return [total.copy() for _ in range(n)]
    if lay.op == "reduce_scatter":
        total = parts(lay, np.sum(np.stack(xs), axis=0, dtype=np.uint32))
        return [total[:, r, :].reshape(-1).copy() for r in range(n)]
    if lay.op == "all_gather":
        out = np.zeros((lay.channels, n, lay.part_words), dtype=np.uint32)
        for r, x in enumerate(xs):
            out[:, r, :] = x.reshape(lay.channels, lay.part_words)
        return [out.reshape(-1).copy() for _ in range(n)]
    outs = []
    for r in range(n):
        out = np.zeros((lay.channels, n, lay.part_words), dtype=np.uint32)
        for j, x in enumerate(xs):
            out[:, j, :] = parts(lay, x)[:, r, :]
        outs.append(out.reshape(-1))
    return outs


def input_of(lay: Layout, seed: int, rank: int) -> np.ndarray:
    """Rank ``rank``'s seeded random input: the same seed gives the same words on every host."""
    return np.random.default_rng([seed, rank]).integers(0, 2 ** 32, lay.input_words(), dtype=np.uint32)


def inputs(lay: Layout, seed: int) -> list[np.ndarray]:
    """Every rank's input."""
    return [input_of(lay, seed, r) for r in range(lay.ranks)]


# ---- figures ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Bandwidth:
    """nccl-tests' two figures for one run of ``size`` bytes in ``time_s``."""

    size: int
    time_s: float
    algbw_bps: float
    busbw_bps: float


def bandwidth(op: str, ranks: int, size: int, time_s: float) -> Bandwidth:
    if time_s <= 0:
        raise CollectiveError(f"a collective's time must be positive, not {time_s}")
    algbw = size * 8 / time_s
    return Bandwidth(size, time_s, algbw, algbw * BUSBW_FACTOR[op](ranks))


def alpha_beta(op: str, ranks: int, size: int, bandwidth_bps: float, alpha_s: float) -> float:
    """The alpha-beta model's time for ``op`` (Thakur et al.; NCCL's ring): every rank moves
    busbw-factor x size over its link at ``bandwidth_bps``, and each of the ring's steps pays the
    latency ``alpha_s`` once (2(n-1) steps for an all-reduce, n-1 for the others; an all-to-all's
    messages all go at once: one)."""
    if op not in OPS:
        raise CollectiveError(f"unknown collective {op!r}: one of {', '.join(OPS)}")
    n_steps = {"all_reduce": 2 * (ranks - 1), "all_gather": ranks - 1, "reduce_scatter": ranks - 1,
               "all_to_all": 1}[op]
    return BUSBW_FACTOR[op](ranks) * size * 8 / bandwidth_bps + n_steps * alpha_s


def ring_path(op: str, hop_alphas: Sequence[float], bandwidth_bps: float, size: int) -> float:
    """The model's time when each rank goes on as soon as its data has come (NCCL's ring has no
    global steps): a chunk crosses the ring's steps' hops one after another, so the latency term
    is the slowest run of that many consecutive hops (``hop_alphas[i]``: rank i to rank i + 1),
    not every step at the longest hop's alpha. On a ring of n ranks over two DCs with two
    crossings, an all-reduce's chunk crosses the long haul 2(n-1) x 2 / n times, not 2(n-1)."""
    if op not in OPS:
        raise CollectiveError(f"unknown collective {op!r}: one of {', '.join(OPS)}")
    n = len(hop_alphas)
    if n < 2:
        raise CollectiveError(f"a ring of {n} hops: at least 2")
    beta = BUSBW_FACTOR[op](n) * size * 8 / bandwidth_bps
    if op == "all_to_all":
        return beta + max(hop_alphas)
    k = 2 * (n - 1) if op == "all_reduce" else n - 1
    return beta + max(sum(hop_alphas[(i + j) % n] for j in range(k)) for i in range(n))


@dataclass(frozen=True)
class Step:
    """A training step: compute, then the gradients' all-reduce, of which ``overlap`` (0..1) can
    run under the compute (bucketed gradients); what cannot is the time spent waiting."""

    compute_s: float
    comm_s: float
    overlap: float

    @property
    def hidden_s(self) -> float:
        return min(self.overlap * self.comm_s, self.compute_s)

    @property
    def exposed_s(self) -> float:
        return self.comm_s - self.hidden_s

    @property
    def step_s(self) -> float:
        return self.compute_s + self.exposed_s

    @property
    def waiting_share(self) -> float:
        """The share of the step spent waiting on the network."""
        return self.exposed_s / self.step_s if self.step_s > 0 else 0.0


def step(compute_s: float, comm_s: float, overlap: float) -> Step:
    if not 0 <= overlap <= 1:
        raise CollectiveError(f"overlap is a share of the all-reduce, 0 to 1, not {overlap}")
    if compute_s < 0 or comm_s < 0:
        raise CollectiveError("compute and communication times cannot be negative")
    return Step(compute_s, comm_s, overlap)
