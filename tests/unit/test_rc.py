"""The RC transport's state machines on a fake network and a fake clock: delivery exactly once,
under loss, reordering, duplication and PSN wrap, in both recovery modes, and the error paths."""
from __future__ import annotations

import os
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from emulator.nic import rc, wire
from emulator.nic.memory import LOCAL_WRITE, REMOTE_READ
from emulator.tools.simnet import A_IP, B_IP, DROP, DUP, LATE, Net, frame, pair

MODES = rc.MODES


def payload(n: int, seed: int = 1) -> bytes:
    return random.Random(seed).randbytes(n)


def write_job(mode: str, size: int, fate=None, wrs: int = 1, delay: float = 0.001, a_psn: int = 0,
              imm: int | None = None, max_time: float = 60.0, **cfg):
    """A writes ``size`` bytes (in ``wrs`` work requests) into a region of B; returns what to check."""
    a, b = pair(mode, a_psn=a_psn, **cfg)
    mr = b.pd.register(bytearray(size))
    data = payload(size)
    chunk = -(-size // wrs)
    for i, off in enumerate(range(0, size, chunk)):
        last = off + chunk >= size
        a.qp.post_write(i, memoryview(data)[off:off + chunk], mr.va + off, mr.rkey, imm=imm if last else None)
    if imm is not None:
        b.qp.post_recv(99, bytearray(0))
    net = Net(a, b, delay=delay, fate=fate or (lambda d, i, t: None))
    net.run(lambda: a.qp.idle or a.qp.error is not None, max_time=max_time)
    return a, b, mr, data, net


def test_a_clean_write_arrives_whole_with_no_retransmission():
    for mode in MODES:
        a, b, mr, data, net = write_job(mode, 1 << 20, wrs=4)
        assert mr.buffer == data
        wcs = a.scq.poll()
        assert [(w.wr_id, w.status, w.byte_len) for w in wcs] == [(i, rc.SUCCESS, 1 << 18) for i in range(4)]
        assert a.qp.stats.data_packets == 256 and a.qp.stats.retransmits == 0 and a.qp.stats.timeouts == 0
        assert b.qp.stats.delivered == 256 and not b.qp.stats.dropped


def test_acks_are_coalesced():
    a, b, mr, data, net = write_job("selective", 1 << 20)
    assert 256 // 16 <= b.qp.stats.acks_sent <= 256 // 16 + 2
    assert net.sent["b>a"] == b.qp.stats.acks_sent


def test_packets_are_what_the_wire_format_says():
    a, b = pair()
    mr = b.pd.register(bytearray(10_001))
    a.qp.post_write(7, payload(10_001), mr.va, mr.rkey, imm=0xABCD)
    pkts = [wire.parse(b"".join(bytes(p) for p in parts) + bytes(4)) for parts in a.qp.transmit(0.0, 10)]
    assert [p.bth.opcode for p in pkts] == [wire.WRITE_FIRST, wire.WRITE_MIDDLE, wire.WRITE_LAST_IMM]
    assert [p.bth.psn for p in pkts] == [0, 1, 2] and all(p.bth.dqpn == b.qp.qpn for p in pkts)
    assert pkts[0].reth == wire.Reth(mr.va, mr.rkey, 10_001)
    assert [len(p.payload) for p in pkts] == [4096, 4096, 1809] and pkts[2].bth.padcount == 3
    assert pkts[2].imm == 0xABCD and pkts[2].bth.ackreq and pkts[0].bth.ackreq and not pkts[1].bth.ackreq


@pytest.mark.parametrize("mode", MODES)
def test_isolated_losses(mode):
    lost = {5, 40, 41, 200}
    a, b, mr, data, net = write_job(mode, 1 << 20, fate=lambda d, i, t: DROP if d == "a>b" and i in lost else None)
    assert mr.buffer == data
    assert b.qp.stats.delivered == 256
    # Each hole is seen by the packets after it: recovered in a round trip or two, never by a
    # timeout (the first RTO alone is 250 ms of this fake clock; a clean run takes 3 ms).
    assert a.qp.stats.timeouts == 0 and net.now < 0.02, (a.qp.stats.timeouts, net.now)
    if mode == "selective":
        assert a.qp.selective and b.qp.selective
        assert a.qp.stats.retransmits == len(lost)  # only the holes
        assert b.qp.stats.held > 0
    else:
        assert a.qp.stats.retransmits > len(lost)  # everything after each hole again
        assert b.qp.stats.dropped["out_of_order"] > 0


@pytest.mark.parametrize("lost", [{5}, {5, 40, 41, 200}, {0}, {254}])
def test_a_selective_sender_against_a_standard_responder_goes_back_n(lost):
    """A QP that offers selective repeat to a peer that does not (rxe, any NIC without IRN)
    uses the standard's semantics: the NAK's MSN is a message count, not a PSN to mark held,
    so each hole is resent with what followed it, at once, without a timeout."""
    a, b = pair("selective", b_mode="go-back-n")
    assert not a.qp.selective and not b.qp.selective
    mr = b.pd.register(bytearray(1 << 20))
    data = payload(1 << 20)
    a.qp.post_write(1, data, mr.va, mr.rkey)
    net = Net(a, b, fate=lambda d, i, t: DROP if d == "a>b" and i in lost else None)
    net.run(lambda: a.qp.idle or a.qp.error is not None)
    assert mr.buffer == data and b.qp.stats.delivered == 256
    assert a.qp.stats.timeouts == 0 and net.now < 0.02, (a.qp.stats.timeouts, net.now)
    assert b.qp.stats.sacks_sent == 0 and b.qp.stats.naks_sent >= 1


@pytest.mark.parametrize("mode", MODES)
def test_a_lost_tail_is_recovered_by_the_timeout(mode):
    a, b, mr, data, net = write_job(mode, 64 << 10, fate=lambda d, i, t: DROP if d == "a>b" and i in (14, 15) else None)
    assert mr.buffer == data and a.qp.stats.timeouts >= 1


@pytest.mark.parametrize("mode", MODES)
def test_lost_acks_and_duplicates_write_once(mode):
    # Every ACK lost for a while: the requester times out and resends; the responder sees
    # duplicates, must not write them again, and ACKs so the requester moves on.
    a, b, mr, data, net = write_job(mode, 256 << 10, fate=lambda d, i, t: DROP if d == "b>a" and i < 6 else None)
    assert mr.buffer == data
    assert b.qp.stats.delivered == 64 and b.qp.stats.dropped.get("duplicate", 0) > 0
    assert a.qp.stats.timeouts >= 1


@pytest.mark.parametrize("mode", MODES)
def test_reordering_and_duplication(mode):
    rnd = random.Random(3)

    def fate(d, i, t):
        r = rnd.random()
        return DUP if r < 0.05 else LATE if r < 0.10 else None

    a, b, mr, data, net = write_job(mode, 1 << 20, fate=fate)
    assert mr.buffer == data and b.qp.stats.delivered == 256
    assert b.qp.stats.dropped.get("duplicate", 0) > 0


@pytest.mark.parametrize("mode", MODES)
def test_psn_wraps_around(mode):
    start = wire.PSN_MOD - 100
    a, b, mr, data, net = write_job(mode, 1 << 20, a_psn=start,
                                    fate=lambda d, i, t: DROP if d == "a>b" and i in (99, 100, 101, 150) else None)
    assert mr.buffer == data and b.qp.stats.delivered == 256
    assert b.qp.epsn == (start + 256) % wire.PSN_MOD
    assert a.qp.psn(a.qp.una) == b.qp.epsn


@pytest.mark.parametrize("mode", MODES)
def test_retry_limit_fails_the_wr_and_flushes_the_rest(mode):
    a, b, mr, data, net = write_job(mode, 1 << 20, wrs=4, fate=lambda d, i, t: DROP if d == "a>b" and i >= 100 else None,
                                    retry_limit=3)
    assert a.qp.error == rc.RETRY_EXC_ERR
    wcs = a.scq.poll()
    assert [w.status for w in wcs] == [rc.SUCCESS, rc.RETRY_EXC_ERR, rc.WR_FLUSH_ERR, rc.WR_FLUSH_ERR]
    assert a.qp.stats.timeouts == 4
    a.qp.post_write(9, b"x", mr.va, mr.rkey)
    assert a.scq.poll()[0].status == rc.WR_FLUSH_ERR


def test_the_timeout_follows_the_rtt():
    far = write_job("selective", 4 << 20, delay=0.015)[0].qp  # 3,000 km: 30 ms round trip
    near = write_job("selective", 4 << 20, delay=0.00001)[0].qp  # in a rack
    assert 0.029 < far.srtt < 0.04 and far.srtt <= far.rto < 0.1
    assert near.srtt < 0.001 and near.rto == near.cfg.rto_min


@pytest.mark.parametrize("mode", MODES)
def test_remote_access_errors(mode):
    a, b = pair(mode)
    ro = b.pd.register(bytearray(8192), access=LOCAL_WRITE | REMOTE_READ)
    rw = b.pd.register(bytearray(8192))
    cases = [(ro.rkey, ro.va), (rw.rkey ^ 1, rw.va), (rw.rkey, rw.va + 4096)]  # no right, bad key, overrun
    for rkey, va in cases:
        a, b = pair(mode)
        ro = b.pd.register(bytearray(8192), access=LOCAL_WRITE | REMOTE_READ)
        rw = b.pd.register(bytearray(8192))
        a.qp.post_write(1, payload(8192), va, rkey)
        a.qp.post_write(2, payload(10), rw.va, rw.rkey)
        Net(a, b).run(lambda: a.qp.error is not None)
        assert [w.status for w in a.scq.poll()] == [rc.REM_ACCESS_ERR, rc.WR_FLUSH_ERR]
        assert ro.buffer == bytearray(8192) and rw.buffer == bytearray(8192)
        assert sum(b.qp.stats.dropped.values()) >= 1


def test_send_and_receive_with_immediate():
    a, b = pair()
    bufs = [bytearray(20_000), bytearray(100)]
    b.qp.post_recv(1, bufs[0])
    b.qp.post_recv(2, bufs[1])
    msg = payload(12_345)
    a.qp.post_send(10, msg, imm=0x1234)
    a.qp.post_send(11, b"hello")
    Net(a, b).run(lambda: a.qp.idle)
    assert [(w.wr_id, w.status, w.opcode, w.byte_len, w.imm) for w in b.rcq.poll()] == [
        (1, rc.SUCCESS, "recv", 12_345, 0x1234), (2, rc.SUCCESS, "recv", 5, None)]
    assert bytes(bufs[0][:12_345]) == msg and bytes(bufs[1][:5]) == b"hello"
    assert [w.status for w in a.scq.poll()] == [rc.SUCCESS, rc.SUCCESS]


def test_write_with_immediate_consumes_a_receive():
    a, b, mr, data, net = write_job("selective", 10_000, imm=77)
    assert [(w.opcode, w.imm, w.byte_len) for w in b.rcq.poll()] == [("recv_rdma_with_imm", 77, 10_000)]


def test_receiver_not_ready_then_ready():
    a, b = pair()
    a.qp.post_send(1, b"early")
    net = Net(a, b)
    net.run(lambda: b.qp.stats.dropped.get("rnr", 0) >= 2)
    buf = bytearray(16)
    b.qp.post_recv(5, buf)
    net.run(lambda: a.qp.idle)
    assert bytes(buf[:5]) == b"early" and a.scq.poll()[0].status == rc.SUCCESS


def test_receiver_never_ready():
    a, b = pair(rnr_retry_limit=2)
    a.qp.post_send(1, b"x")
    Net(a, b).run(lambda: a.qp.error is not None)
    assert a.scq.poll()[0].status == rc.RNR_RETRY_EXC_ERR


def test_a_send_larger_than_the_receive_buffer():
    a, b = pair()
    buf = bytearray(10)
    b.qp.post_recv(1, buf)
    a.qp.post_send(1, payload(11))
    Net(a, b).run(lambda: a.qp.error is not None)
    assert b.rcq.poll()[0].status == rc.LOC_LEN_ERR
    assert a.scq.poll()[0].status == rc.REM_INV_REQ_ERR


def test_psns_far_outside_the_window_are_counted_and_dropped():
    a, b = pair()
    mr = b.pd.register(bytearray(64))
    for psn in (b.qp.epsn + 100_000, b.qp.epsn - 100_000):
        body = wire.build(wire.Bth(wire.WRITE_ONLY, b.qp.qpn, psn % wire.PSN_MOD), b"x" * 4,
                          reth=wire.Reth(mr.va, mr.rkey, 4))
        b.qp.receive(wire.parse(body + bytes(4)), 0.0)
    assert b.qp.stats.dropped == {"psn_out_of_window": 2} and not b.qp.outbox and mr.buffer == bytearray(64)


def test_in_flight_is_capped_at_the_window():
    a, b = pair(max_inflight=32)
    mr = b.pd.register(bytearray(1 << 20))
    a.qp.post_write(1, payload(1 << 20), mr.va, mr.rkey)
    assert len(a.qp.transmit(0.0, 1000)) == 32 and a.qp.transmit(0.0, 1000) == []


# --- properties: any loss pattern below the retry limit delivers everything exactly once ---

fates = st.lists(st.sampled_from([None, None, None, None, DROP, DUP, LATE]), min_size=1, max_size=400)


@pytest.mark.parametrize("mode", MODES)
@settings(max_examples=int(os.environ.get("BP_HYPOTHESIS_EXAMPLES", "200")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(data_fates=fates, ack_fates=fates, size=st.integers(1, 300_000), wrs=st.integers(1, 5),
       start=st.sampled_from([0, wire.PSN_MOD - 20, wire.PSN_MOD - 1, 12345]))
def test_any_loss_pattern_delivers_exactly_once(mode, data_fates, ack_fates, size, wrs, start):
    def fate(d, i, t):
        seq = data_fates if d == "a>b" else ack_fates
        return seq[i] if i < len(seq) else None  # the pattern ends: below the retry limit

    # "Below the retry limit": every timeout without progress costs at least one drop, so a
    # limit above the number of drops puts any pattern below it (the limit itself is tested
    # in test_retry_limit_fails_the_wr_and_flushes_the_rest).
    drops = data_fates.count(DROP) + ack_fates.count(DROP)
    a, b, mr, data, net = write_job(mode, size, fate=fate, wrs=wrs, a_psn=start, delay=0.0005,
                                    retry_limit=drops + 1, max_time=3600.0)
    assert a.qp.error is None and a.qp.idle
    assert mr.buffer == data
    npkts = sum(max(1, -(-len(memoryview(data)[o:o + -(-size // wrs)]) // 4096)) for o in range(0, size, -(-size // wrs)))
    assert b.qp.stats.delivered == npkts  # each PSN executed once, however often it arrived
    assert len(a.scq.poll()) == len(range(0, size, -(-size // wrs)))


def test_several_lost_tail_packets_cost_one_timeout_in_selective_mode():
    """The last nine packets lost, and nothing after them to SACK: the timeout resends the
    oldest packet not acknowledged (49: its ACK was not asked for yet); its ACK shows the
    holes sent well before it (RACK's three transmissions) lost, so they go at once, and their
    ACKs do the same for the last few: one timeout, not one per hole."""
    lost = set(range(55, 64))
    a, b, mr, data, net = write_job("selective", 256 << 10,
                                    fate=lambda d, i, t: DROP if d == "a>b" and i in lost else None)
    assert mr.buffer == data
    assert a.qp.stats.timeouts == 1 and a.qp.stats.retransmits == 1 + len(lost)


# --- the receive fast path (QueuePair.write_next) against the full parse ---

def _responder_state(side) -> tuple:
    qp = side.qp
    return (bytes(side.pd.regions[next(iter(side.pd.regions))].buffer), qp.epsn, qp.msn, qp.stats,
            [b"".join(bytes(p) for p in parts) for parts in qp.outbox], [w for w in side.rcq.poll(1000)],
            sorted(qp._held), qp._nak_sent, qp._rnr_sent)


@pytest.mark.parametrize("mode", MODES)
@settings(max_examples=int(os.environ.get("BP_HYPOTHESIS_EXAMPLES", "200")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(st.tuples(st.sampled_from(["next"] * 6 + ["back", "skip"]), st.integers(1, 5),
                                st.sampled_from(["as is"] * 8 + ["short", "long", "pad"])), min_size=1, max_size=120),
       size=st.integers(1, 40 * 4096), imm=st.booleans())
def test_the_fast_path_does_what_the_full_parse_does(mode, steps, size, imm):
    """Any stream of a WRITE's packets (mostly in order; some again, some skipped, some with a
    payload too short, too long or mis-padded) leaves a responder that takes plain WRITEs
    through write_next in the state of one that parses every packet: memory, PSNs, answers,
    counters, completions."""
    sender, slow = pair(mode)
    _, fast = pair(mode)
    for side in (slow, fast):
        side.pd.register(bytearray(size))
        side.qp.post_recv(1, bytearray(0))
    mr = slow.pd.regions[next(iter(slow.pd.regions))]
    sender.qp.post_write(0, payload(size), mr.va, mr.rkey, imm=7 if imm else None)
    pkts = []
    while len(pkts) < -(-size // 4096):
        pkts.extend(sender.qp.transmit(0.0, 64))
    cursor = 0
    for action, k, how in steps:
        if action == "skip":
            cursor += k
            continue
        i = cursor if action == "next" else max(0, cursor - k)
        cursor += action == "next"
        hdr, body, pad = (bytes(p) for p in pkts[i % len(pkts)])
        if how == "short":
            body = body[:-4]
        elif how == "long":
            body = body + bytes(4)
        elif how == "pad" and body:
            hdr = hdr[:1] + bytes([hdr[1] | 0x10]) + hdr[2:]  # PadCnt 1 over an unpadded payload
        ip, udp, transport = frame(A_IP, B_IP, 49152, [hdr, body, pad])
        slow.qp.receive(wire.parse(transport, ip, udp), 0.0)
        plain = wire.plain_write(memoryview(transport))
        if plain is None or not fast.qp.write_next(*plain[1:]):
            fast.qp.receive(wire.parse(transport, ip, udp), 0.0)
        assert _responder_state(fast) == _responder_state(slow)
        for side in (slow, fast):
            side.qp.outbox.clear()


@pytest.mark.parametrize("imm", [None, 7])
def test_a_write_in_order_takes_the_fast_path_for_every_plain_packet(imm):
    """Every WRITE_MIDDLE, and the WRITE_LAST without immediate, goes through write_next; the
    WRITE_FIRST (its RETH) and a LAST_WITH_IMMEDIATE (a receive to consume) are parsed."""
    a, b = pair()
    mr = b.pd.register(bytearray(10 * 4096 + 100))
    b.qp.post_recv(1, bytearray(0))
    data = payload(len(mr.buffer))
    a.qp.post_write(0, data, mr.va, mr.rkey, imm=imm)
    fast = []
    for parts in a.qp.transmit(0.0, 64):
        ip, udp, transport = frame(A_IP, B_IP, 49152, parts)
        plain = wire.plain_write(memoryview(transport))
        fast.append(plain is not None and b.qp.write_next(*plain[1:]))
        if not fast[-1]:
            b.qp.receive(wire.parse(transport, ip, udp), 0.0)
    assert fast == [False] + [True] * 9 + [imm is None]
    assert mr.buffer == data and b.qp.stats.delivered == 11 and b.qp.msn == 1
