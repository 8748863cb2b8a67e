"""The few bpf(2) calls bcc 0.26 does not offer: BPF_PROG_TEST_RUN, a program's id.

bcc compiles, relocates and loads the programs; running one on a crafted packet is done here
with the raw system call.
"""
from __future__ import annotations

import ctypes as ct
import os
from dataclasses import dataclass

_libc = ct.CDLL(None, use_errno=True)
_SYS_BPF = 321  # x86_64
BPF_PROG_TEST_RUN = 10


class BpfError(OSError):
    """A bpf(2) call failed; the verifier's log, when there is one, is in the message."""


class _TestRun(ct.Structure):
    _fields_ = [
        ("prog_fd", ct.c_uint32), ("retval", ct.c_uint32), ("data_size_in", ct.c_uint32),
        ("data_size_out", ct.c_uint32), ("data_in", ct.c_uint64), ("data_out", ct.c_uint64),
        ("repeat", ct.c_uint32), ("duration", ct.c_uint32), ("ctx_size_in", ct.c_uint32),
        ("ctx_size_out", ct.c_uint32), ("ctx_in", ct.c_uint64), ("ctx_out", ct.c_uint64),
        ("flags", ct.c_uint32), ("cpu", ct.c_uint32), ("batch_size", ct.c_uint32),
    ]


def _bpf(cmd: int, attr: ct.Structure) -> int:
    ret = _libc.syscall(_SYS_BPF, cmd, ct.byref(attr), ct.sizeof(attr))
    if ret < 0:
        err = ct.get_errno()
        raise BpfError(err, os.strerror(err))
    return ret


@dataclass
class RunResult:
    retval: int
    data: bytes  # the packet after the program
    ctx: bytes
    duration_ns: int


def prog_test_run(prog_fd: int, data: bytes, ctx: bytes | None = None, repeat: int = 1,
             out_size: int | None = None) -> RunResult:
    """Run a loaded program on ``data`` with BPF_PROG_TEST_RUN."""
    size = out_size or len(data) + 256
    din = ct.create_string_buffer(bytes(data), len(data))
    dout = ct.create_string_buffer(size)
    attr = _TestRun(prog_fd=prog_fd, data_size_in=len(data), data_size_out=size,
                    data_in=ct.addressof(din), data_out=ct.addressof(dout), repeat=repeat)
    cin = cout = None
    if ctx is not None:
        cin = ct.create_string_buffer(bytes(ctx), len(ctx))
        cout = ct.create_string_buffer(len(ctx))
        attr.ctx_in, attr.ctx_size_in = ct.addressof(cin), len(ctx)
        attr.ctx_out, attr.ctx_size_out = ct.addressof(cout), len(ctx)
    _bpf(BPF_PROG_TEST_RUN, attr)
    return RunResult(attr.retval, dout.raw[: attr.data_size_out],
                   cout.raw[: attr.ctx_size_out] if cout is not None else b"", attr.duration)


def prog_id(fd: int) -> int:
    """The kernel's id of the program behind ``fd`` (what `ip link` and `tc filter` show)."""
    with open(f"/proc/self/fdinfo/{fd}") as f:
        for line in f:
            if line.startswith("prog_id:"):
                return int(line.split()[1])
    raise BpfError(0, f"fd {fd} is not a BPF program")
