"""The soft-NIC's socket loop over loopback: two NICs, real UDP sockets, ICRCs checked both ways."""
from __future__ import annotations

import random
import socket

import pytest

from emulator.nic import wire
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
