"""The few bpf(2) calls bcc 0.26 does not offer: loading XDP with frags, BPF_PROG_TEST_RUN.

bcc compiles and relocates the programs (map fds are already in the instructions); loading an
XDP program that accepts multi-buffer frames (BPF_F_XDP_HAS_FRAGS, needed for 4 KB RoCE frames
on veth) and running a program on a crafted packet are done here with the raw system call.
"""
from __future__ import annotations

import ctypes as ct
import os
from dataclasses import dataclass

_libc = ct.CDLL(None, use_errno=True)
_SYS_BPF = 321  # x86_64
BPF_PROG_LOAD = 5
BPF_PROG_TEST_RUN = 10
BPF_PROG_TYPE_SCHED_CLS = 3
BPF_PROG_TYPE_XDP = 6
BPF_XDP = 37  # expected_attach_type
BPF_F_XDP_HAS_FRAGS = 1 << 5
LOG_SIZE = 1 << 20


class BpfError(OSError):
    """A bpf(2) call failed; the verifier's log, when there is one, is in the message."""


class _ProgLoad(ct.Structure):
    _fields_ = [
        ("prog_type", ct.c_uint32), ("insn_cnt", ct.c_uint32), ("insns", ct.c_uint64),
        ("license", ct.c_uint64), ("log_level", ct.c_uint32), ("log_size", ct.c_uint32),
        ("log_buf", ct.c_uint64), ("kern_version", ct.c_uint32), ("prog_flags", ct.c_uint32),
        ("prog_name", ct.c_char * 16), ("prog_ifindex", ct.c_uint32),
        ("expected_attach_type", ct.c_uint32),
    ]


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


def load_xdp_frags(name: str, insns: int, size: int, license_: bytes = b"GPL") -> int:
    """Load the relocated XDP instructions at address ``insns`` with BPF_F_XDP_HAS_FRAGS."""
    lic = ct.create_string_buffer(license_)
    log = ct.create_string_buffer(LOG_SIZE)
    attr = _ProgLoad(prog_type=BPF_PROG_TYPE_XDP, insn_cnt=size // 8, insns=insns,
                     license=ct.addressof(lic), prog_flags=BPF_F_XDP_HAS_FRAGS,
                     prog_name=name.encode()[:15], expected_attach_type=BPF_XDP)
    try:
        return _bpf(BPF_PROG_LOAD, attr)
    except BpfError:
        attr.log_level, attr.log_size, attr.log_buf = 1, LOG_SIZE, ct.addressof(log)
        try:
            return _bpf(BPF_PROG_LOAD, attr)
        except BpfError as e:
            text = log.value.decode(errors="replace").strip().splitlines()
            raise BpfError(e.errno, f"loading {name}: {e.strerror}; verifier: {' | '.join(text[-8:])}") from None


@dataclass
class RunResult:
    retval: int
    data: bytes  # the packet after the program (XDP: starting at its metadata, if any)
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
