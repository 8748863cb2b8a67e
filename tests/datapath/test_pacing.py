"""Dequeue pacing (Mininet-HiFi's fidelity check) on crafted frames: the ingress program run on a
port whose peer's egress queue (IN_PORT's) holds a backlog we set in the map.

A gap is real time between two test runs (microseconds), so the tests pick rates that put it
in a known bin: at 1 byte/s a frame's ideal gap is a minute (ratio ~0, first bin); at 2^32-1
bytes/s it is nanoseconds (ratio far above 4, last bin). Where a bin must be exact, the gap is
read back from the map (last_ns before and after) and binned by a Python reference.
"""
from __future__ import annotations

import ctypes as ct
import random

import pytest

from emulator.bpf import structs as S

from .conftest import FIBER_PORT, IN_PORT, MAC_IN, MAC_PEER, NODE_ID
from .test_programs import TC_ACT_OK, roce, run_in

MAX_RATE = 0xFFFFFFFF  # bytes/s: a 58-byte frame's ideal gap is 14 ns, any two runs are further apart
QUEUE = IN_PORT  # the egress queue being timed: FIBER_PORT sees its dequeues


def total_slot() -> ct.c_int:
    return ct.c_int(QUEUE * S.QUEUE_SLOTS + S.NUM_PRIO)


def set_port(dp, rate: int, flags: int = 0) -> None:
    """FIBER_PORT as the port that sees QUEUE's frames leave, timing them against ``rate``."""
    dp.set_port(FIBER_PORT, S.Port(NODE_ID + 1, flags, QUEUE, 0, S.mac_bytes(MAC_PEER), S.mac_bytes(MAC_IN), 0,
                                   rate))


def set_backlog(dp, depth: int) -> None:
    """Make QUEUE hold ``depth`` bytes (with the frame about to leave it)."""
    q = dp.table("bp_queues")[total_slot()]
    q.enq_bytes = q.deq_bytes + depth
    dp.table("bp_queues")[total_slot()] = q


def raw(dp) -> S.Pacing:
    return dp.table("bp_pacing")[ct.c_int(QUEUE)]


def dequeue(dp, data: bytes, left: int) -> None:
    """One frame leaves QUEUE, leaving ``left`` bytes behind it."""
    set_backlog(dp, len(data) + left)
    assert run_in(dp, data, port=FIBER_PORT).retval == TC_ACT_OK


def ref_bin(gap_ns: int, rate: int, charged: int) -> int:
    """The kernel's bin, in Python: edges reached by gap / (charged / rate)."""
    paid = min(gap_ns, S.PACING_GAP_MAX) * rate
    return sum(paid >= e * charged * S.PACING_NS_PER_ONE for e in S.PACING_EDGES)


@pytest.fixture
def paced(programmed):
    """The port table entry, queue and pacing slot these tests write, restored afterwards."""
    dp = programmed
    saved = (dp.table("bp_ports")[ct.c_int(FIBER_PORT)], [dp.table("bp_queues")[ct.c_int(QUEUE * S.QUEUE_SLOTS + s)]
                                                          for s in range(S.QUEUE_SLOTS)], raw(dp))
    dp.table("bp_pacing")[ct.c_int(QUEUE)] = S.Pacing()
    yield dp
    dp.set_port(FIBER_PORT, saved[0])
    for s, q in enumerate(saved[1]):
        dp.table("bp_queues")[ct.c_int(QUEUE * S.QUEUE_SLOTS + s)] = q
    dp.table("bp_pacing")[ct.c_int(QUEUE)] = saved[2]


def test_no_gap_after_a_dequeue_that_left_the_queue_empty(paced):
    set_port(paced, MAX_RATE)
    data = roce(payload=0)
    dequeue(paced, data, left=0)  # the queue ran dry: whenever the next frame comes, no gap
    dequeue(paced, data, left=4 * len(data))
    p = paced.pacing(QUEUE)
    assert p["busy_gaps"] == 0 and p["busy_ns"] == 0 and p["busy_bytes"] == 0, p
    assert raw(paced).backlogged == 1 and raw(paced).last_len == len(data)


@pytest.mark.parametrize("rate,bin_", [(1, 0), (MAX_RATE, S.PACING_BINS - 1)])
def test_one_gap_after_a_dequeue_that_left_backlog(paced, rate, bin_):
    set_port(paced, rate)
    data = roce(payload=0)
    dequeue(paced, data, left=len(data))
    first = raw(paced).last_ns
    dequeue(paced, data, left=0)
    gap = raw(paced).last_ns - first
    p = paced.pacing(QUEUE)
    want = [0] * S.PACING_BINS
    want[bin_] = 1
    assert p["counts"] == want, (p, gap)
    assert ref_bin(gap, rate, len(data)) == bin_
    assert p["busy_gaps"] == 1 and p["busy_ns"] == gap and p["busy_bytes"] == len(data), p
    assert p["edges"] == [e / 100 for e in S.PACING_EDGES] and len(p["counts"]) == len(p["edges"]) + 1


@pytest.mark.parametrize("flags", [0, S.PORT_PEER_TBF])
def test_busy_bytes_and_gaps_add_up(paced, flags):
    """A busy period of frames of mixed sizes, then one that empties the queue. The gaps
    telescope to the span from the first dequeue to the last; HTB charges each gap to the frame
    before it, TBF to the frame after it."""
    set_port(paced, 50_000_000, flags)  # 400 Mb/s, the default fabric's links at scale 1/1000
    sizes = [0, 3000, 64, 1024, 3000, 0, 2048]  # a test run's skb holds at most a page
    frames = [roce(payload=n) for n in sizes]
    stamps = []
    for i, data in enumerate(frames):
        dequeue(paced, data, left=0 if i == len(frames) - 1 else 10_000)
        stamps.append(raw(paced).last_ns)
    dequeue(paced, frames[0], left=0)  # after an empty queue: not a gap
    p = paced.pacing(QUEUE)
    lens = [len(f) for f in frames]
    assert p["busy_gaps"] == len(frames) - 1 == sum(p["counts"])
    assert p["busy_ns"] == stamps[-1] - stamps[0]
    assert p["busy_bytes"] == sum(lens[1:] if flags & S.PORT_PEER_TBF else lens[:-1])


def test_bins_match_the_reference(paced):
    """Rates spread so the ratios fall across the bins; each gap, read back from the map, is
    binned in Python with the same integer arithmetic and must land where the kernel put it."""
    data = roce(payload=1024)
    set_port(paced, MAX_RATE)
    dequeue(paced, data, left=len(data))
    rng = random.Random("pacing")
    seen = set()
    for _ in range(400):
        rate = int(10 ** rng.uniform(6, 9.6))  # 1 MB/s .. 4 GB/s: a 1 KB frame's time is 0.3 us .. 1 ms
        set_port(paced, rate)
        before, last = paced.pacing(QUEUE)["counts"], raw(paced).last_ns
        dequeue(paced, data, left=len(data))
        gap = raw(paced).last_ns - last
        after = paced.pacing(QUEUE)["counts"]
        got = [i for i in range(S.PACING_BINS) if after[i] != before[i]]
        want = ref_bin(gap, rate, len(data))
        assert got == [want], (gap, rate, got, want)
        seen.add(want)
    print(f"bins exercised: {sorted(seen)}")
    assert len(seen) >= 4, seen  # the rates span 3.6 decades of ratio: more than the edges do


def test_rate_zero_records_nothing(paced):
    set_port(paced, 0)
    data = roce(payload=0)
    for left in (len(data), len(data), 0):
        dequeue(paced, data, left=left)
    assert bytes(raw(paced)) == bytes(S.Pacing())
    assert paced.queue(QUEUE)["deq_pkts"] >= 3  # the dequeues were counted all the same
