"""recvmmsg for the soft-NIC's receive socket: datagrams, their lengths and their control
messages as the kernel gave them, over loopback UDP (no root needed)."""
from __future__ import annotations

import socket
import struct
import time

import pytest

from emulator.nic import mmsg

SO_RXQ_OVFL, SO_TIMESTAMPNS = 40, 35

pytestmark = pytest.mark.skipif(not mmsg.available(), reason="no recvmmsg with LP64 structures here")


def _pair(rcvbuf: int | None = None) -> tuple[socket.socket, socket.socket]:
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    if rcvbuf is not None:
        rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    rx.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    rx.setsockopt(socket.SOL_SOCKET, SO_RXQ_OVFL, 1)
    rx.bind(("127.0.0.1", 0))
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx.connect(rx.getsockname())
    return rx, tx


def test_one_read_returns_every_datagram_waiting_with_its_length_bytes_and_arrival_time():
    rx, tx = _pair()
    batch = mmsg.RecvBatch(rx.fileno(), count=8)
    try:
        sent = [bytes([i]) * n for i, n in enumerate((1, 4096, 9000, 65507))]
        before = time.time()
        for d in sent:
            tx.send(d)
        assert batch.read() == len(sent)
        assert [batch.frame(i).tobytes() for i in range(len(sent))] == sent
        stamps = []
        for i in range(len(sent)):
            (cm,) = batch.controls(i)
            assert (cm.level, cm.kind, len(cm.data)) == (socket.SOL_SOCKET, SO_TIMESTAMPNS, 16)
            sec, nsec = struct.unpack("=qq", cm.data)
            stamps.append(sec + nsec * 1e-9)
            assert batch.control_length(i) == socket.CMSG_SPACE(16)
        assert stamps == sorted(stamps) and before - 1 <= stamps[0] <= time.time() + 1
        assert batch.read() == 0  # nothing left: no wait, no error
    finally:
        rx.close()
        tx.close()


def test_a_read_takes_at_most_its_limit_and_leaves_the_rest_for_the_next():
    rx, tx = _pair()
    batch = mmsg.RecvBatch(rx.fileno(), count=4)
    try:
        for i in range(6):
            tx.send(bytes([i]))
        assert batch.read(limit=2) == 2 and batch.frame(1).tobytes() == b"\x01"
        assert batch.read() == 4 and [batch.frame(i).tobytes() for i in range(4)] == [bytes([i]) for i in range(2, 6)]
    finally:
        rx.close()
        tx.close()


def test_datagrams_the_kernel_dropped_on_a_full_buffer_are_counted_in_a_control_message():
    rx, tx = _pair(rcvbuf=4096)
    batch = mmsg.RecvBatch(rx.fileno(), count=64)
    try:
        for _ in range(200):
            tx.send(bytes(1000))
        got = batch.read()
        assert 0 < got < 200
        # The count rides on datagrams queued after the drops: the next one to come.
        tx.send(b"after")
        assert batch.read() == 1 and batch.frame(0).tobytes() == b"after"
        drops = [struct.unpack("=I", cm.data[:4])[0] for cm in batch.controls(0) if cm.kind == SO_RXQ_OVFL]
        assert drops == [200 - got]
        assert batch.control_length(0) > socket.CMSG_SPACE(16)  # more than the arrival time alone
    finally:
        rx.close()
        tx.close()
