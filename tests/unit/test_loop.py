"""The soft-NIC's socket loop over loopback: two NICs, real UDP sockets, ICRCs checked both ways."""
from __future__ import annotations

import random
import socket

import pytest

from emulator.nic import dcqcn, wire
from emulator.nic.loop import SoftNic
from emulator.nic.rc import SUCCESS, QpConfig


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
            qa.connect(qb.qpn, qb.ipsn)
            qb.connect(qa.qpn, qa.ipsn)
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
        data = random.Random(3).randbytes(size)
        mr = b.pd.register(bytearray(size))
        qa = a.create_qp("127.0.0.3", QpConfig())
        qb = b.create_qp("127.0.0.2", QpConfig())
        qa.connect(qb.qpn, qb.ipsn)
        qb.connect(qa.qpn, qa.ipsn)
        a._peer[qa.qpn][1].setsockopt(socket.IPPROTO_IP, socket.IP_TOS, (26 << 2) | 3)  # CE
        qa.post_write(1, data, mr.va, mr.rkey)

        def done() -> bool:
            b.step(0.001)
            return qa.idle

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
