"""The collectives' schedules carried out in memory against what each operation means, their
shape (steps, bytes per link), nccl-tests' figures and the alpha-beta and step models."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from emulator.workload import collectives as C


@pytest.mark.parametrize("op", C.OPS)
@pytest.mark.parametrize("ranks", [2, 3, 4, 5, 8])
@pytest.mark.parametrize("channels", [1, 2, 3])
def test_every_schedule_computes_its_operation(op, ranks, channels):
    lay = C.layout(op, 4096 * ranks * channels, ranks, channels)
    xs = C.inputs(lay, seed=7)
    got, want = C.execute(lay, xs), C.expected(lay, xs)
    assert len(got) == ranks
    for r in range(ranks):
        assert got[r].size == lay.output_words()
        assert np.array_equal(got[r], want[r]), (op, ranks, channels, r)


@settings(max_examples=60, deadline=None)
@given(op=st.sampled_from(C.OPS), ranks=st.integers(2, 9), channels=st.integers(1, 4),
       words=st.integers(1, 40), seed=st.integers(0, 2 ** 31))
def test_any_layout_and_data(op, ranks, channels, words, seed):
    lay = C.layout(op, words * C.WORD * ranks * channels, ranks, channels)
    xs = C.inputs(lay, seed)
    assert all(np.array_equal(a, b) for a, b in zip(C.execute(lay, xs), C.expected(lay, xs)))


def test_the_sum_wraps_modulo_2_32():
    lay = C.layout("all_reduce", 8 * C.WORD, 2)
    xs = [np.full(8, 2 ** 32 - 1, dtype=np.uint32), np.full(8, 2, dtype=np.uint32)]
    assert all(np.array_equal(o, np.ones(8, dtype=np.uint32)) for o in C.execute(lay, xs))


def test_a_wrong_schedule_is_caught(monkeypatch):
    """The in-memory check is what guards the wire: a ring that forgets one reduce is wrong."""
    lay = C.layout("all_reduce", 64 * 4, 4)
    right = C.schedule(lay)
    broken = (C.Send(**{**right[0].__dict__, "reduce": False}),) + right[1:]
    monkeypatch.setattr(C, "schedule", lambda _lay: broken)
    xs = C.inputs(lay, 1)
    assert not all(np.array_equal(a, b) for a, b in zip(C.execute(lay, xs), C.expected(lay, xs)))


@pytest.mark.parametrize("op, n_steps", [("all_reduce", 14), ("all_gather", 7), ("reduce_scatter", 7),
                                         ("all_to_all", 1)])
def test_ring_steps_and_bytes_per_rank_match_the_busbw_factor(op, n_steps):
    """What each rank sends, over the size, is nccl-tests' busbw factor: a ring is optimal."""
    n, channels = 8, 2
    lay = C.layout(op, n * channels * 1024 * C.WORD, n, channels)
    sends = C.schedule(lay)
    assert C.steps(sends) == n_steps
    for r in range(n):
        sent = sum(lay.part_bytes for s in sends if s.src == r)
        received = sum(lay.part_bytes for s in sends if s.dst == r)
        assert sent == received == pytest.approx(C.BUSBW_FACTOR[op](n) * lay.size)
    if op != "all_to_all":  # a ring: every rank talks to its successor only
        assert all(s.dst == (s.src + 1) % n for s in sends)


def test_layout_rounds_down_and_refuses_what_cannot_split():
    lay = C.layout("all_reduce", 1000, 3, 2)  # 1000 B over 6 parts of 4-byte words
    assert lay.part_words == 41 and lay.size == 984
    with pytest.raises(C.CollectiveError, match="at least 24 B"):
        C.layout("all_reduce", 20, 3, 2)
    with pytest.raises(C.CollectiveError, match="unknown collective 'broadcast'"):
        C.layout("broadcast", 1 << 20, 4)
    with pytest.raises(C.CollectiveError, match="at least 2 ranks"):
        C.layout("all_gather", 1 << 20, 1)
    with pytest.raises(C.CollectiveError, match="input has"):
        C.execute(C.layout("all_gather", 64, 2), [np.zeros(16, np.uint32), np.zeros(8, np.uint32)])


def test_nccl_tests_figures():
    # 1 GB all-reduce over 8 ranks in 40 ms: algbw 200 Gb/s, busbw x 2*7/8 = 350 Gb/s.
    bw = C.bandwidth("all_reduce", 8, 10 ** 9, 0.040)
    assert bw.algbw_bps == pytest.approx(200e9) and bw.busbw_bps == pytest.approx(350e9)
    assert C.bandwidth("all_gather", 4, 10 ** 9, 0.040).busbw_bps == pytest.approx(150e9)
    with pytest.raises(C.CollectiveError):
        C.bandwidth("all_reduce", 8, 1, 0)


def test_alpha_beta():
    # Ring all-reduce: 2(n-1)/n x S/B + 2(n-1) alpha.
    t = C.alpha_beta("all_reduce", 8, 10 ** 9, 400e9, 15e-3)
    assert t == pytest.approx(2 * 7 / 8 * 8e9 / 400e9 + 14 * 15e-3)
    assert C.alpha_beta("all_to_all", 8, 10 ** 9, 400e9, 1e-6) == pytest.approx(7 / 8 * 8e9 / 400e9 + 1e-6)


def test_step_model():
    s = C.step(compute_s=1.0, comm_s=0.5, overlap=0.8)  # 0.4 s hidden under compute
    assert s.step_s == pytest.approx(1.1) and s.waiting_share == pytest.approx(0.1 / 1.1)
    s = C.step(compute_s=0.1, comm_s=1.0, overlap=1.0)  # overlap cannot hide more than the compute
    assert s.exposed_s == pytest.approx(0.9) and s.step_s == pytest.approx(1.0)
    assert C.step(1.0, 0.5, 0.0).step_s == pytest.approx(1.5)
    with pytest.raises(C.CollectiveError, match="overlap"):
        C.step(1.0, 0.5, 1.5)


# ---- the ranks on soft-NICs over loopback ------------------------------------------------------

def _loopback(addrs: list[str]) -> bool:
    import socket
    try:
        for a in addrs:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.bind((a, 0))
        return True
    except OSError:
        return False


def _run_ranks(op: str, ranks: int, channels: int, qps: int, size: int, loss: float = 0.0, admission: int = 0,
               watch=None, **rank_options):
    """Every rank of ``op`` on its own soft-NIC (127.0.0.10+i), the NICs stepped in turn by one
    loop; ``loss``: that share of each NIC's data packets is dropped before it leaves (seeded);
    ``watch(ranks)`` is called after every round of the loop."""
    import random

    from emulator.nic.loop import SoftNic
    from emulator.nic.rc import QpConfig
    from emulator.workload.rank import Rank

    ips = [f"127.0.0.{10 + i}" for i in range(ranks)]
    if not _loopback(ips):
        pytest.skip("no 127.0.0.10+ on loopback")
    lay = C.layout(op, size, ranks, channels)
    xs = C.inputs(lay, seed=11)
    nics = [SoftNic(ip) for ip in ips]
    try:
        rng = random.Random(5)
        if loss:
            for nic in nics:
                send = nic._send

                def lossy(qpn, parts, send=send):
                    return 0 if rng.random() < loss else send(qpn, parts)
                nic._send = lossy
        cfg = QpConfig(mode="selective", rto_initial=0.02, rto_min=0.01)
        rs = [Rank(nic, lay, r, xs[r], ips, qps=qps, config=cfg, admission=admission, **rank_options)
              for r, nic in enumerate(nics)]
        ready = [r.ready() for r in rs]
        for r in rs:
            r.connect(ready)

        def done() -> bool:
            for nic in nics[1:]:
                nic.step(0)
            finished = all([r.progress() for r in rs])
            if watch is not None:
                watch(rs)
            return finished

        assert nics[0].run(done, timeout=60, busy=lambda: any(r.busy for r in rs))
        return lay, xs, rs
    finally:
        for nic in nics:
            nic.close()


@pytest.mark.parametrize("op", C.OPS)
def test_ranks_on_soft_nics_compute_the_operation(op):
    lay, xs, rs = _run_ranks(op, ranks=4, channels=2, qps=3, size=4 * 2 * 3 * 4096 * 2)
    want = C.expected(lay, xs)
    assert all(not r.failed for r in rs)
    assert all(np.array_equal(r.result(), want[r.rank]) for r in rs)
    # Each rank put busbw-factor x size on the wire, no more (the ring is optimal).
    assert all(r.sent_bytes == r.received_bytes == pytest.approx(C.BUSBW_FACTOR[op](4) * lay.size) for r in rs)


def test_ranks_heal_loss_with_selective_repeat():
    lay, xs, rs = _run_ranks("all_reduce", ranks=3, channels=1, qps=2, size=3 * 64 * 4096, loss=0.02)
    want = C.expected(lay, xs)
    assert all(np.array_equal(r.result(), want[r.rank]) for r in rs)
    assert sum(q.stats.retransmits for r in rs for qs in r.out.values() for q in qs) > 0


@pytest.mark.parametrize("op", C.OPS)
def test_chunks_go_through_the_steps_on_their_own(op):
    """A message cut into chunks dealt round its QPs: a chunk goes on to the next step as soon
    as it has come and been reduced, while the step's other chunks are still on the wire, and
    the result is still exact, under loss, with a budget of work per call small enough that the
    rank stops with work left (busy) again and again."""
    spread, busy = [], []

    def watch(rs):
        spread.append(max(max(c) - min(c) for r in rs for c in r.col))
        busy.append(any(r.busy for r in rs))
    lay, xs, rs = _run_ranks(op, ranks=4, channels=2, qps=3, size=4 * 2 * 9 * 4096, loss=0.02, watch=watch,
                             chunk=4096, work=2 * 4096)
    want = C.expected(lay, xs)
    assert all(not r.failed for r in rs)
    assert all(len(r.chunks) == 9 for r in rs)  # 9 chunks of a part, 3 on each QP
    assert all(np.array_equal(r.result(), want[r.rank]) for r in rs)
    assert all(r.sent_bytes == r.received_bytes == pytest.approx(C.BUSBW_FACTOR[op](4) * lay.size) for r in rs)
    if C.steps(C.schedule(lay)) > 1:
        assert max(spread) >= 1  # some chunk a step ahead of another of its channel
    assert any(busy)


def _in_flight(rs) -> dict[tuple[int, int], int]:
    """Per link (src, dst) and channel: messages the sender has posted that the receiver has not
    yet used."""
    out = {}
    for r in rs:
        for s in r.mine:
            if (s.step, s.channel) in r.posted and rs[s.dst].cur[s.channel] <= s.step:
                key = (s.src, s.dst, s.channel)
                out[key] = out.get(key, 0) + 1
    return out


@pytest.mark.parametrize("op", C.OPS)
@pytest.mark.parametrize("window", [1, 2])
def test_clear_to_send_admits_at_most_its_window_per_link_and_channel(op, window):
    seen = []

    def watch(rs):
        seen.append(max(_in_flight(rs).values(), default=0))
    lay, xs, rs = _run_ranks(op, ranks=4, channels=2, qps=2, size=4 * 2 * 2 * 4096 * 2, admission=window,
                             watch=watch)
    want = C.expected(lay, xs)
    assert all(not r.failed for r in rs)
    assert all(np.array_equal(r.result(), want[r.rank]) for r in rs)
    assert max(seen) <= window
    # Every message the rank sent was cleared by its receiver first, and only once.
    assert all(len(r.cleared) == len(r.mine) for r in rs)
    assert all(len(r.granted) == len(r.incoming) for r in rs)


def test_without_admission_senders_run_ahead():
    """The window above is the admission's doing: without it a sender posts a message as soon as
    it holds the data, more than one per link and channel."""
    seen = []
    _run_ranks("all_gather", ranks=4, channels=2, qps=2, size=4 * 2 * 2 * 4096 * 2,
               watch=lambda rs: seen.append(max(_in_flight(rs).values(), default=0)))
    assert max(seen) > 1


def test_the_ring_path_model_charges_a_chunk_only_the_crossings_on_its_way():
    # 8 ranks, 4 in each DC: two of the ring's hops cross (15 ms), six stay in a DC (2 us).
    alphas = [2e-6, 2e-6, 2e-6, 15e-3, 2e-6, 2e-6, 2e-6, 15e-3]
    beta = 2 * 7 / 8 * 8e9 / 400e9
    # 14 consecutive hops hold at most 4 crossings (one lap of 8 has 2, the 6 after it 2 more).
    assert C.ring_path("all_reduce", alphas, 400e9, 10 ** 9) == pytest.approx(beta + 4 * 15e-3 + 10 * 2e-6)
    assert C.ring_path("all_reduce", alphas, 400e9, 10 ** 9) < C.alpha_beta("all_reduce", 8, 10 ** 9, 400e9, 15e-3)
    # In one DC every hop alike: the two models agree.
    same = [2e-6] * 8
    assert C.ring_path("all_reduce", same, 400e9, 10 ** 9) == pytest.approx(
        C.alpha_beta("all_reduce", 8, 10 ** 9, 400e9, 2e-6))
    assert C.ring_path("all_to_all", alphas, 400e9, 10 ** 9) == pytest.approx(7 / 8 * 8e9 / 400e9 + 15e-3)


def test_a_request_the_ranks_cannot_carry_out_is_refused_before_anything_starts():
    from pathlib import Path

    from emulator.errors import UsageError
    from emulator.model import plan, spec
    from emulator.workload import collective

    p = plan.build(spec.load(Path(__file__).resolve().parents[2] / "topologies" / "single-dc.yaml"), "t1")
    hosts = ["local-host0", "local-host1"]
    lay = collective.check_request(p, "all_reduce", hosts, 1 << 20, 1, 16, "selective", 1, 10.0, chunk=4096)
    assert lay.size == 1 << 20
    with pytest.raises(UsageError, match="chunk of 1000 B: at least one frame's payload, 4096 B"):
        collective.check_request(p, "all_reduce", hosts, 1 << 20, 1, 16, "selective", 1, 10.0, chunk=1000)
    with pytest.raises(UsageError, match="admission window 65"):
        collective.check_request(p, "all_reduce", hosts, 1 << 20, 1, 16, "selective", 1, 10.0, admission=65)
    with pytest.raises(UsageError, match="named twice"):
        collective.check_request(p, "all_reduce", hosts[:1] * 2, 1 << 20, 1, 16, "selective", 1, 10.0)
