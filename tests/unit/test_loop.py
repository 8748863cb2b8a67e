"""The soft-NIC's socket loop over loopback: two NICs, real UDP sockets, ICRCs checked both ways."""
from __future__ import annotations

import dataclasses
import random
import socket

import pytest

from emulator.nic import dcqcn, wire
from emulator.nic.loop import SoftNic
from emulator.nic.rc import QpConfig, SUCCESS


def _loopback(addr: str) -> bool:
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind((addr, 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _loopback("127.0.0.2"), reason="no 127.0.0.2 on loopback")
def test_two_nics_over_loopback():
    a, b = SoftNic("127.0.0.2"), SoftNic("127.0.0.3")
    try:
        size = 8 << 20
        data = random.Random(2).randbytes(size)
        mr = b.pd.register(bytearray(size))
        pairs = []
        for i in range(2):
            qa = a.create_qp("127.0.0.3", QpConfig(), initial_psn=wire.PSN_MOD - 100 * i)
            qb = b.create_qp("127.0.0.2", QpConfig(), initial_psn=12345)
            qa.connect(qb.qpn, qb.ipsn, sack=True)
            qb.connect(qa.qpn, qa.ipsn, sack=True)
            pairs.append((qa, qb))
        half = size // 2
        for i, (qa, _) in enumerate(pairs):
            for off in range(i * half, (i + 1) * half, 1 << 20):
                qa.post_write(off, memoryview(data)[off:off + (1 << 20)], mr.va + off, mr.rkey)

        def done() -> bool:
            b.step(0.001)
            return all(qa.idle for qa, _ in pairs)

        assert a.run(done, timeout=60)
        assert mr.buffer == data
        assert all(wc.status == SUCCESS for qa, _ in pairs for wc in qa.send_cq.poll())
        assert a.stats()["dropped"] == {} and b.stats()["dropped"] == {}
        assert sum(qb.stats.delivered for _, qb in pairs) == size // 4096
    finally:
        a.close()
        b.close()


def _marked_write(a: SoftNic, b: SoftNic, size: int, seed: int):
    """A connected QP pair from ``a`` to ``b``, the sender's data leaving CE-marked (as a
    congested switch would leave it), and one WRITE of ``size`` seeded bytes posted:
    (sender QP, receiver QP, target region, the data)."""
    mr = b.pd.register(bytearray(size))
    qa = a.create_qp("127.0.0.3", QpConfig())
    qb = b.create_qp("127.0.0.2", QpConfig())
    qa.connect(qb.qpn, qb.ipsn, sack=True)
    qb.connect(qa.qpn, qa.ipsn, sack=True)
    a._peer[qa.qpn][1].setsockopt(socket.IPPROTO_IP, socket.IP_TOS, (26 << 2) | 3)  # CE
    data = random.Random(seed).randbytes(size)
    qa.post_write(1, data, mr.va, mr.rkey)
    return qa, qb, mr, data


@pytest.mark.skipif(not _loopback("127.0.0.2"), reason="no 127.0.0.2 on loopback")
@pytest.mark.parametrize("cc", ["paper", "off"])
def test_ce_marks_bring_cnps_that_slow_the_sender(cc):
    """Data sent CE-marked (as a congested switch would leave it): the receiver's notification
    point answers with CNPs, at most one per 50 us, and the sender's reaction point cuts its rate;
    with DCQCN off nothing of that happens. The data arrives intact either way."""
    line = 400e6
    p = dcqcn.profile(cc, line)
    a, b = SoftNic("127.0.0.2", line, cc=p), SoftNic("127.0.0.3", line, cc=p)
    try:
        size = 2 << 20
        qa, qb, mr, data = _marked_write(a, b, size, 3)

        def done() -> bool:  # the data acked, and every CNP sent heard and acted on
            b.step(0.001)
            return qa.idle and not (a.cnps_pending or b.cnps_pending) and qa.stats.cnps_received == qb.stats.cnps_sent

        assert a.run(done, timeout=60)
        assert mr.buffer == data
        assert b.stats()["rx_ce"] == size // 4096
        if cc == "off":
            assert qb.stats.cnps_sent == 0 and qa.stats.cnps_received == 0 and qa.rp is None
        else:
            assert qb.stats.cnps_sent > 0 and qa.stats.cnps_received == qb.stats.cnps_sent
            assert qa.rp.cnps == qa.stats.cnps_received and qa.rp.rc < line
            assert a.stats()["dropped"] == {} and b.stats()["dropped"] == {}
    finally:
        a.close()
        b.close()


@pytest.mark.skipif(not _loopback("127.0.0.2"), reason="no 127.0.0.2 on loopback")
def test_the_loop_runs_dcqcn_on_the_dilated_clock_and_holds_the_wire_to_its_rate():
    """At dilation 10 the NICs' protocol clock runs 10x slower than the wall: the notification
    point's N of 50 us (real) spaces CNPs 500 us of wall time apart, a configured CNP delay of
    200 us (real) holds each CNP back 2 ms of wall time, and the sender puts on the wire no
    more than its rate's integral allows (plus its pacer's burst)."""
    d = 10.0
    line = 400e6 * d  # 400 Mb/s of wall rate, in the loop's units (per virtual second)
    p = dcqcn.profile("paper", line)
    p = dataclasses.replace(p, cnp_delay_s=200e-6)
    burst = 2 * 4196
    a = SoftNic("127.0.0.2", line, cc=p, dilation=d, burst_bytes=burst, pace_burst=burst)
    b = SoftNic("127.0.0.3", line, cc=p, dilation=d, burst_bytes=burst, pace_burst=burst)
    try:
        qa, qb, mr, data = _marked_write(a, b, 2 << 20, 4)
        start = a.wall()

        def done() -> bool:  # the data acked, and every CNP sent heard and acted on
            b.step(0.001)
            return qa.idle and not (a.cnps_pending or b.cnps_pending) and qa.stats.cnps_received == qb.stats.cnps_sent

        assert a.run(done, timeout=120)
        wall = a.wall() - start
        assert mr.buffer == data
        sent = qb.stats.cnps_sent
        assert sent > 0 and qa.stats.cnps_received == sent
        # One CNP per N of virtual time at most: N x d of wall time apart.
        assert sent <= wall / (p.cnp_interval_s * d) + 1, (sent, wall)
        # Each left at least the configured delay (x d of wall time) after its marked packet arrived.
        assert min(b.cnp_delays) >= p.cnp_delay_s * d * 0.99, min(b.cnp_delays)
        st = a.qp_state(qa.qpn)
        assert st.tx_bytes * 8 <= st.allowed_bits + 8 * (burst + 4196 + 46), st
        assert st.rc_bps < 400e6  # in wall units: the cut rate, below the line
    finally:
        a.close()
        b.close()


def _raw_send(src: str, dst: str, transport: bytes, ident: int, df: bool, icrc_ident: int | None = None) -> None:
    """One RoCEv2 datagram with the IP header given here (IP ID, DF), sent as is: what a kernel
    peer such as rdma_rxe puts on the wire. ``icrc_ident``: compute the ICRC over another ID."""
    ip, udp = wire.ipv4_udp_headers(src, dst, 50000, len(transport) + wire.ICRC_LEN, ident=ident, df=df)
    crc_ip, _ = wire.ipv4_udp_headers(src, dst, 50000, len(transport) + wire.ICRC_LEN,
                                      ident=ident if icrc_ident is None else icrc_ident, df=df)
    with socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW) as s:
        s.sendto(ip + udp + transport + wire.icrc(crc_ip, udp, transport), (dst, 0))


@pytest.mark.skipif(not _loopback("127.0.0.2"), reason="no 127.0.0.2 on loopback")
def test_the_icrc_is_checked_over_the_ip_header_the_packet_came_with():
    """A peer that numbers its datagrams (non-zero IP ID) or sends them without DF is heard:
    the ICRC covers those fields, so the NIC checks it over the header that arrived, and a
    packet whose ICRC was made over another ID is refused as bad_icrc."""
    b = SoftNic("127.0.0.3")
    try:
        mr = b.pd.register(bytearray(12))
        qb = b.create_qp("127.0.0.2", QpConfig(), qpn=0x4242)
        qb.connect(0x77, 1000)
        cases = [(0x1234, True, None), (0xBEEF, False, None), (0x0001, True, 0)]
        for psn, (ident, df, icrc_ident) in enumerate(cases, start=1000):
            body = wire.build(wire.Bth(wire.WRITE_ONLY, 0x4242, psn, ackreq=True), bytes([psn % 256]) * 4,
                              reth=wire.Reth(mr.va + 4 * (psn - 1000), mr.rkey, 4))
            _raw_send("127.0.0.2", "127.0.0.3", body, ident, df, icrc_ident)
        b.run(lambda: b.counters.rx_packets >= 3, timeout=10, max_wait=0.01)
        assert qb.stats.delivered == 2 and mr.buffer == bytes([232] * 4 + [233] * 4 + [0] * 4)
        assert b.counters.dropped == {"bad_icrc": 1}
    finally:
        b.close()


@pytest.mark.skipif(not _loopback("127.0.0.2"), reason="no 127.0.0.2 on loopback")
def test_read_send_and_write_with_immediate_over_loopback():
    """The verbs a RoCE application uses, over real sockets, with QPNs, PSNs, R_Keys and
    addresses the application chose."""
    a, b = SoftNic("127.0.0.2"), SoftNic("127.0.0.3")
    try:
        cfg = QpConfig(mtu=1024)
        src = random.Random(5).randbytes(70_000)
        mr = b.pd.register(bytearray(src), va=0x7000_0000, rkey=0xC0FFEE)
        qa = a.create_qp("127.0.0.3", cfg, initial_psn=0xFFFFF0, qpn=0x11)
        qb = b.create_qp("127.0.0.2", cfg, initial_psn=7, qpn=0x22)
        qa.connect(0x22, 7)
        qb.connect(0x11, 0xFFFFF0)
        got = bytearray(70_000)
        qa.post_read(1, got, 0x7000_0000, 0xC0FFEE)
        recv = bytearray(100)
        qb.post_recv(9, recv)
        qb.post_recv(10, bytearray(0))
        qa.post_send(2, b"hello", imm=0xAB)
        qa.post_write(3, b"abc", 0x7000_0000, 0xC0FFEE, imm=0xCD)

        def done() -> bool:
            b.step(0.001)
            return qa.idle

        assert a.run(done, timeout=60)
        assert got == src and bytes(recv[:5]) == b"hello" and mr.buffer[:3] == b"abc"
        assert [(w.wr_id, w.status, w.opcode, w.byte_len) for w in qa.send_cq.poll()] == [
            (1, SUCCESS, "read", 70_000), (2, SUCCESS, "send", 5), (3, SUCCESS, "write", 3)]
        assert [(w.wr_id, w.opcode, w.imm) for w in qb.recv_cq.poll()] == [(9, "recv", 0xAB),
                                                                          (10, "recv_rdma_with_imm", 0xCD)]
        assert qb.stats.read_responses == 69 and a.stats()["dropped"] == {} and b.stats()["dropped"] == {}
    finally:
        a.close()
        b.close()


def test_a_qpn_is_the_applications_to_choose_but_never_twice():
    a = SoftNic("127.0.0.1")
    try:
        assert a.create_qp("127.0.0.1", qpn=0x123456).qpn == 0x123456
        assert a.create_qp("127.0.0.1").qpn == 0x100
        for bad in (0, 1, 1 << 24, 0x123456):
            with pytest.raises(ValueError):
                a.create_qp("127.0.0.1", qpn=bad)
    finally:
        a.close()


@pytest.mark.skipif(not _loopback("127.0.0.2"), reason="no 127.0.0.2 on loopback")
def test_qps_with_work_share_a_paced_line_in_turn_whatever_idle_qps_sit_between_them():
    """A message split over QPs finishes on all of them together, as a NIC's arbiter serves the
    QPs with work in turn: QPs with nothing to send (a rank's receive QPs) between them take no
    turns of their own and hand none to the next busy one. A NIC held to a few frames per turn by
    its rate is where the order of turns shows."""
    frames = 64
    a = SoftNic("127.0.0.2", 200e6, burst_bytes=2 * 4200)
    b = SoftNic("127.0.0.3")
    try:
        mr = b.pd.register(bytearray(4 * frames * 4096))
        pairs = []
        for _ in range(16):  # 4 to send on, then 12 idle after them, as a rank's receive QPs
            qa, qb = a.create_qp("127.0.0.3"), b.create_qp("127.0.0.2")
            qa.connect(qb.qpn, qb.ipsn)
            qb.connect(qa.qpn, qa.ipsn)
            pairs.append(qa)
        busy = pairs[:4]
        for i, qa in enumerate(busy):
            qa.post_write(i, bytes(frames * 4096), mr.va + i * frames * 4096, mr.rkey)

        def first_done() -> bool:
            b.step(0)
            return any(q.una == q.end for q in busy)

        assert a.run(first_done, timeout=60)
        sent = [q.stats.data_packets for q in busy]
        # When the first is through, each of the others has sent nearly all of its share too.
        assert min(sent) >= frames - 8, sent
    finally:
        a.close()
        b.close()


@pytest.mark.skipif(not _loopback("127.0.0.3"), reason="no 127.0.0.3 on loopback")
def test_datagrams_the_kernel_dropped_before_the_nic_read_them_are_counted():
    """A receive buffer overrun is the emulator's own loss, which the fidelity monitor reads:
    the NIC reports the kernel's count of datagrams dropped on its full socket."""
    b = SoftNic("127.0.0.3")
    try:
        b.rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx:
            for _ in range(100):
                tx.sendto(bytes(1000), ("127.0.0.3", wire.ROCE_PORT))
            b.step(0)
            read = b.counters.rx_packets
            assert b.counters.socket_overflow == 0  # the count rides on the datagrams after the drops
            tx.sendto(bytes(1000), ("127.0.0.3", wire.ROCE_PORT))
            b.step(0)
        assert b.counters.rx_packets == read + 1
        assert b.counters.socket_overflow == 100 - read
        assert sum(b.counters.dropped.values()) == read + 1  # none of them RoCEv2: each counted, none raised
    finally:
        b.close()
