"""recvmmsg(2) for the soft-NIC's receive socket: many datagrams, each with its control messages,
in one system call. Python's socket module has no recvmmsg, and one recvmsg_into per packet
costs a system call and a tuple, a list and a bytes object per control message before the
packet is even looked at; here the kernel fills preallocated slots and the loop reads lengths
and control messages out of them only where it needs them.

Linux x86-64 and other LP64 targets only (struct layouts from <sys/socket.h>); ``available()``
says whether this process can use it.
"""
from __future__ import annotations

import ctypes
import errno
import os
import struct
from dataclasses import dataclass

MSG_DONTWAIT = 0x40
SLOT = 65536  # an IPv4 datagram's largest size: no packet is ever cut short
CONTROL = 64  # a timestamp (32 bytes with its header) and a drop count (24): both fit
_CMSG_HDR = struct.Struct("=QiI")  # cmsg_len, cmsg_level, cmsg_type


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


class _Msghdr(ctypes.Structure):
    _fields_ = [("name", ctypes.c_void_p), ("namelen", ctypes.c_uint32), ("iov", ctypes.c_void_p),
                ("iovlen", ctypes.c_size_t), ("control", ctypes.c_void_p), ("controllen", ctypes.c_size_t),
                ("flags", ctypes.c_int)]


class _Mmsghdr(ctypes.Structure):
    _fields_ = [("hdr", _Msghdr), ("len", ctypes.c_uint)]


_MMSG = ctypes.sizeof(_Mmsghdr)
_LEN = _Mmsghdr.len.offset // 4  # the fields read per message, as indices of a view in words
_CONTROLLEN = _Msghdr.controllen.offset // 8
_libc = ctypes.CDLL(None, use_errno=True)


def available() -> bool:
    """recvmmsg exists here and the structures have the layout this module assumes."""
    return hasattr(_libc, "recvmmsg") and ctypes.sizeof(ctypes.c_void_p) == 8 and _MMSG == 64


@dataclass(frozen=True)
class Control:
    """One control message of a received datagram."""

    level: int
    kind: int
    data: memoryview


class RecvBatch:
    """Up to ``count`` datagrams per ``read`` from the socket with file descriptor ``fd``."""

    def __init__(self, fd: int, count: int = 128) -> None:
        if not available():
            raise OSError(errno.ENOSYS, "recvmmsg with LP64 structures is not available here")
        self.fd = fd
        self.count = count
        self._data = (ctypes.c_char * (count * SLOT))()
        self._control = (ctypes.c_char * (count * CONTROL))()
        self._iov = (_Iovec * count)()
        self._hdrs = (_Mmsghdr * count)()
        base, cbase = ctypes.addressof(self._data), ctypes.addressof(self._control)
        for i in range(count):
            self._iov[i].base, self._iov[i].len = base + i * SLOT, SLOT
            h = self._hdrs[i].hdr
            h.iov, h.iovlen = ctypes.addressof(self._iov[i]), 1
            h.control, h.controllen = cbase + i * CONTROL, CONTROL
        # The kernel writes each header's lengths and flags back: restored in one copy per read.
        self._pristine = bytes(self._hdrs)
        self._words = memoryview(self._hdrs).cast("B").cast("I")
        self._quads = memoryview(self._hdrs).cast("B").cast("Q")
        self.data = memoryview(self._data).cast("B")
        self.control_bytes = memoryview(self._control).cast("B")
        self._call = _libc.recvmmsg
        self._call.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int, ctypes.c_void_p]
        self._call.restype = ctypes.c_int
        self._addr = ctypes.addressof(self._hdrs)

    def read(self, limit: int | None = None) -> int:
        """How many datagrams the socket had (at most ``limit``, or ``count``), without waiting."""
        ctypes.memmove(self._addr, self._pristine, len(self._pristine))
        n = self._call(self.fd, self._addr, min(limit or self.count, self.count), MSG_DONTWAIT, None)
        if n < 0:
            err = ctypes.get_errno()
            if err in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EINTR):
                return 0
            raise OSError(err, os.strerror(err))
        return n

    def frame(self, i: int) -> memoryview:
        """Datagram ``i`` of the last read (a view of its slot: valid until the next read)."""
        return self.data[i * SLOT:i * SLOT + self._words[i * _MMSG // 4 + _LEN]]

    def control_length(self, i: int) -> int:
        """How many bytes of control messages datagram ``i`` came with."""
        return self._quads[i * _MMSG // 8 + _CONTROLLEN]

    def controls(self, i: int) -> list[Control]:
        """Datagram ``i``'s control messages."""
        out = []
        base, end = i * CONTROL, i * CONTROL + min(self.control_length(i), CONTROL)
        view = self.control_bytes
        off = base
        while off + _CMSG_HDR.size <= end:
            length, level, kind = _CMSG_HDR.unpack_from(view, off)
            if length < _CMSG_HDR.size or off + length > end:
                break
            out.append(Control(level, kind, view[off + _CMSG_HDR.size:off + length]))
            off += (length + 7) & ~7
        return out
