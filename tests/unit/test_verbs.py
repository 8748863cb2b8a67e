"""RC verbs beyond WRITE on the fake network: READ as requester and responder (segmented at
the MTU, lost requests and responses asked again), RNR NAK timers both ways, and the work
completions a verbs user polls for."""
from __future__ import annotations

import os
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from emulator.nic import rc, wire
from emulator.nic.memory import REMOTE_WRITE
from emulator.tools.simnet import DROP, DUP, LATE, Net, pair

MODES = rc.MODES
LENGTHS = [1, 1023, 1024, 1025, 4096, 65536]


def payload(n: int, seed: int = 1) -> bytes:
    return random.Random(seed).randbytes(n)


def read_job(mode: str, size: int, fate=None, b_mode: str | None = None, **cfg):
    a, b = pair(mode, b_mode=b_mode, mtu=1024, **cfg)
    src = payload(size, size)
    mr = b.pd.register(bytearray(src))
    got = bytearray(size)
    a.qp.post_read(7, got, mr.va, mr.rkey)
    net = Net(a, b, fate=fate or (lambda d, i, t: None))
    net.run(lambda: a.qp.idle or a.qp.error is not None)
    return a, b, src, got, net


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("size", LENGTHS)
def test_a_read_is_answered_in_mtu_sized_responses(mode, size):
    a, b, src, got, net = read_job(mode, size)
    assert got == src
    n = -(-size // 1024)
    assert [(w.wr_id, w.status, w.opcode, w.byte_len) for w in a.scq.poll()] == [(7, rc.SUCCESS, "read", size)]
    assert b.qp.stats.read_responses == n and net.sent == {"a>b": 1, "b>a": n}
    assert a.qp.stats.retransmits == 0 and b.qp.stats.acks_sent == 0  # the responses are the ACK
    assert b.qp.epsn == n and b.qp.msn == 1 and not a.rcq.poll() and not b.rcq.poll()


def test_the_responses_on_the_wire():
    a, b = pair(mtu=1024)
    mr = b.pd.register(bytearray(2500))
    a.qp.post_read(1, bytearray(2500), mr.va + 0, mr.rkey)
    (req,) = a.qp.transmit(0.0, 10)
    pkt = wire.parse(b"".join(bytes(p) for p in req) + bytes(4))
    assert pkt.bth.opcode == wire.READ_REQUEST and pkt.reth == wire.Reth(mr.va, mr.rkey, 2500)
    assert a.qp.nxt == 3  # the request took a PSN for each response
    b.qp.receive(pkt, 0.0)
    resp = [wire.parse(b"".join(bytes(p) for p in parts) + bytes(4)) for parts in b.qp.outbox]
    assert [p.bth.opcode for p in resp] == [wire.READ_RESPONSE_FIRST, wire.READ_RESPONSE_MIDDLE,
                                            wire.READ_RESPONSE_LAST]
    assert [p.bth.psn for p in resp] == [0, 1, 2] and [len(p.payload) for p in resp] == [1024, 1024, 452]
    assert resp[0].aeth == wire.Aeth(rc.AETH_ACK_NO_CREDIT, 1) and resp[1].aeth is None and resp[2].aeth.msn == 1


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("lost", [("a>b", 0), ("b>a", 0), ("b>a", 30), ("b>a", 63)])
def test_a_lost_request_or_response_is_asked_again(mode, lost):
    """One packet of a 64 KiB READ lost: the request (the timeout resends it), the first or a
    middle response (the next one shows the hole: the READ is asked again from there at once)
    or the last one (nothing follows it: the timeout)."""
    a, b, src, got, net = read_job(mode, 65536, fate=lambda d, i, t: DROP if (d, i) == lost else None)
    assert got == src and a.scq.poll()[0].status == rc.SUCCESS
    assert a.qp.stats.retransmits == 1
    if lost[0] == "b>a" and lost[1] < 63:
        assert a.qp.stats.timeouts == 0 and net.now < 0.01
        assert b.qp.stats.read_responses == 64 + 64 - lost[1]  # the rest again, from the hole
    else:
        assert a.qp.stats.timeouts == 1


@pytest.mark.parametrize("mode", MODES)
def test_a_read_behind_writes_whose_ack_was_lost(mode):
    """A WRITE, then a READ: the WRITE's ACK is lost, but the first response acknowledges it."""
    a, b = pair(mode, mtu=1024)
    mr = b.pd.register(bytearray(8192))
    a.qp.post_write(1, payload(4096), mr.va, mr.rkey)
    got = bytearray(4096)
    a.qp.post_read(2, got, mr.va, mr.rkey)
    net = Net(a, b, fate=lambda d, i, t: DROP if (d, i) == ("b>a", 0) else None)
    net.run(lambda: a.qp.idle)
    assert got == payload(4096) and [w.opcode for w in a.scq.poll()] == ["write", "read"]
    assert a.qp.stats.timeouts == 0 and a.qp.stats.retransmits == 0


def test_an_ack_past_an_unanswered_read_asks_for_it_again():
    """READ responses lost, then an ACK for a later WRITE: the READ was not answered in full,
    so the ACK stops at it and the READ goes again (IBTA's implicit NAK) without a timeout."""
    a, b = pair("go-back-n", mtu=1024)
    mr = b.pd.register(bytearray(8192))
    got = bytearray(2048)
    a.qp.post_read(1, got, mr.va + 100, mr.rkey)
    a.qp.post_write(2, b"tail", mr.va + 5000, mr.rkey)
    b.pd.regions[mr.rkey].buffer[100:2148] = payload(2048)
    net = Net(a, b, fate=lambda d, i, t: DROP if d == "b>a" and i in (0, 1) else None)
    net.run(lambda: a.qp.idle)
    assert got == payload(2048) and [w.opcode for w in a.scq.poll()] == ["read", "write"]
    assert a.qp.stats.timeouts == 0


@pytest.mark.parametrize("mode", MODES)
def test_reads_outstanding_are_capped(mode):
    a, b = pair(mode, mtu=1024, max_rd_atomic=2)
    mr = b.pd.register(bytearray(1024))
    bufs = [bytearray(1024) for _ in range(5)]
    for i, buf in enumerate(bufs):
        a.qp.post_read(i, buf, mr.va, mr.rkey)
    assert len(a.qp.transmit(0.0, 100)) == 2
    Net(a, b).run(lambda: a.qp.idle)
    assert [w.wr_id for w in a.scq.poll()] == [0, 1, 2, 3, 4]


def test_a_read_without_the_right_is_refused():
    a, b = pair(mtu=1024)
    mr = b.pd.register(bytearray(4096), access=REMOTE_WRITE)
    a.qp.post_read(1, bytearray(100), mr.va, mr.rkey)
    a.qp.post_read(2, bytearray(100), mr.va + 4090, mr.rkey)
    Net(a, b).run(lambda: a.qp.error is not None)
    assert [w.status for w in a.scq.poll()] == [rc.REM_ACCESS_ERR, rc.WR_FLUSH_ERR]
    assert b.qp.stats.dropped == {"access_denied": 1}


def test_a_read_needs_a_buffer_it_can_write():
    a, b = pair()
    with pytest.raises(ValueError):
        a.qp.post_read(1, b"read-only", 0, 0)


@pytest.mark.parametrize("code", [1, 14, 20])
def test_an_rnr_nak_carries_the_responders_timer_and_the_requester_waits_it(code):
    """The responder answers a SEND without a receive with RNR NAK and its min_rnr_timer; the
    requester waits what that code stands for (IBTA table 45) before it tries again."""
    a, b = pair(min_rnr_timer=code, rnr_retry_limit=3)
    a.qp.post_send(1, b"early")
    net = Net(a, b, delay=1e-6)
    tries = []
    real = b.qp.on_request

    def seen(pkt, now):
        tries.append(now)
        real(pkt, now)

    b.qp.on_request = seen
    net.run(lambda: a.qp.error is not None)
    assert a.scq.poll()[0].status == rc.RNR_RETRY_EXC_ERR and len(tries) == 4
    wait = rc.rnr_delay(code)
    assert wait == {1: 10e-6, 14: 1.28e-3, 20: 10.24e-3}[code]
    gaps = [t2 - t1 for t1, t2 in zip(tries, tries[1:])]
    assert all(wait <= g < wait + 1e-4 for g in gaps), gaps


def test_rnr_retry_seven_means_forever():
    a, b = pair(min_rnr_timer=1)  # the default rnr_retry_limit is 7
    a.qp.post_send(1, b"late")
    net = Net(a, b, delay=1e-6)
    net.run(lambda: b.qp.stats.dropped.get("rnr", 0) >= 50)
    assert a.qp.error is None
    buf = bytearray(8)
    b.qp.post_recv(3, buf)
    net.run(lambda: a.qp.idle)
    assert bytes(buf[:4]) == b"late" and a.scq.poll()[0].status == rc.SUCCESS


# --- any mix of operations under any loss pattern: each executed once, every byte where it belongs ---

ops = st.lists(st.tuples(st.sampled_from(["write", "write_imm", "send", "read"]), st.integers(0, 5000)),
               min_size=1, max_size=8)
fates = st.lists(st.sampled_from([None, None, None, None, DROP, DUP, LATE]), min_size=1, max_size=200)


@pytest.mark.parametrize("mode", MODES)
@settings(max_examples=int(os.environ.get("BP_HYPOTHESIS_EXAMPLES", "200")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(ops=ops, data_fates=fates, ack_fates=fates, start=st.sampled_from([0, wire.PSN_MOD - 3]))
def test_any_mix_of_verbs_under_any_loss(mode, ops, data_fates, ack_fates, start):
    def fate(d, i, t):
        seq = data_fates if d == "a>b" else ack_fates
        return seq[i] if i < len(seq) else None

    drops = data_fates.count(DROP) + ack_fates.count(DROP)
    a, b = pair(mode, a_psn=start, mtu=1024, retry_limit=drops + 1)
    region = payload(64 << 10, 9)
    mr = b.pd.register(bytearray(region))
    want = bytearray(region)
    reads, sends = [], []
    off = 0
    for i, (op, n) in enumerate(ops):
        data = payload(n, i)
        if op == "read":
            buf = bytearray(n)
            reads.append((buf, bytes(want[off:off + n])))
            a.qp.post_read(i, buf, mr.va + off, mr.rkey)
        elif op == "send":
            buf = bytearray(n)
            b.qp.post_recv(i, buf)
            sends.append((buf, data))
            a.qp.post_send(i, data, imm=i)
        else:
            if op == "write_imm":
                b.qp.post_recv(i, bytearray(0))
            a.qp.post_write(i, data, mr.va + off, mr.rkey, imm=i if op == "write_imm" else None)
            want[off:off + n] = data
        off = (off + n) % ((64 << 10) - 5000)
    Net(a, b, delay=0.0005, fate=fate).run(lambda: a.qp.idle or a.qp.error is not None, max_time=3600.0)
    assert a.qp.error is None and a.qp.idle
    assert mr.buffer == want
    assert all(bytes(buf) == expect for buf, expect in reads)
    assert all(bytes(buf) == data for buf, data in sends)
    wcs = a.scq.poll(100)
    kinds = {"write": "write", "write_imm": "write", "send": "send", "read": "read"}
    assert [(w.wr_id, w.opcode, w.status) for w in wcs] == [(i, kinds[op], rc.SUCCESS) for i, (op, _) in enumerate(ops)]
    assert sorted(w.wr_id for w in b.rcq.poll(100)) == sorted(i for i, (op, _) in enumerate(ops)
                                                             if op in ("send", "write_imm"))
