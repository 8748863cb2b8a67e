"""The soft-NIC against a standard RoCEv2 stack: Linux rdma_rxe, driven through libibverbs.

One process drives both peers on one clock: the rxe side through pyverbs (a context on the rxe
device, a PD, a CQ, a QP per case, in the root namespace where rxe lives), the soft-NIC in the
rig's namespace (its sockets opened there). Each ``Case`` connects a fresh pair of QPs the way
verbs applications do (QPN, PSN, R_Key and VA exchanged out of band; the soft-NIC's QPN chosen
here, not by the NIC), runs one operation in one direction and checks every byte, the
immediate data and the work completions on both sides. A case may lose one data packet on the
wire (once) or start without a receive posted (RNR NAK), to hold both peers' recovery to the
standard.
"""
from __future__ import annotations

import ipaddress
import random
import signal
import socket
import subprocess
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterator

from emulator.fabric import netns
from emulator.fabric.rxe import RxeLink
from emulator.nic import wire
from emulator.nic.loop import SoftNic
from emulator.nic.rc import QpConfig, QueuePair, SUCCESS

OPS = ("write", "write_imm", "send", "send_imm", "read")
LENGTHS = (1, 1023, 1024, 1025, 4096, 65536)  # one byte to 64 KiB, across the 1024-byte path MTU
REQUESTERS = ("softnic", "rxe")
MODES = ("selective", "go-back-n")
LOSS_LENGTH = 65536
LOSS_INDEX = 30  # the data packet lost in a loss case: mid-message, so what follows shows the hole
RNR_TIMER = 14  # both responders' min_rnr_timer: 1.28 ms (IBTA table 45)
CASE_TIMEOUT_S = 60.0  # wall seconds; software-emulated guests are slow
# The soft-NIC's RTO floor here: a recovery the standard does at once (NAK, READ re-request)
# takes a round trip or two; a turn of the loop in a software-emulated guest can stall for
# longer than the default 10 ms, and a timeout then would say nothing about the protocol.
RTO_MIN_S = 0.1
IMM = 0x5EED1234


@dataclass(frozen=True)
class Case:
    op: str  # one of OPS
    length: int
    requester: str  # softnic | rxe
    mode: str  # the soft-NIC's transport (what it offers; rxe never agrees to selective repeat)
    loss: bool = False  # data packet LOSS_INDEX lost on the wire, once
    rnr: bool = False  # the receive is posted only after the responder sent an RNR NAK

    @property
    def name(self) -> str:
        extra = " loss" if self.loss else " rnr" if self.rnr else ""
        return f"{self.requester}->{'rxe' if self.requester == 'softnic' else 'softnic'} {self.op} {self.length}B {self.mode}{extra}"


@dataclass(frozen=True)
class Outcome:
    case: Case
    ok: bool
    detail: str  # what was wrong; empty when ok
    seconds: float
    requester_wcs: list[str]  # "opcode status byte_len"
    responder_wcs: list[str]
    retransmits: int  # the soft-NIC's, when it is the requester
    timeouts: int
    injected: int  # packets lost on purpose
    rnr_naks: int  # RNR NAKs the responder sent
    nic_drops: dict[str, int] = field(default_factory=dict)  # the soft-NIC's refusals during the case
    rxe_counters: dict[str, int] = field(default_factory=dict)  # rxe's hw_counters that moved (send_err, ...)

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Completion:
    """A work completion from either side, in the soft-NIC's names (ibv_wc_opcode's)."""

    opcode: str
    status: str
    byte_len: int
    imm: int | None = None

    def __str__(self) -> str:
        return f"{self.opcode} {self.status} {self.byte_len}"


def matrix(loss: bool = True, rnr: bool = True) -> list[Case]:
    """Every operation, length, direction and transport; then one loss per operation, direction
    and transport; then RNR both ways."""
    cases = [Case(op, n, r, m) for r in REQUESTERS for m in MODES for op in OPS for n in LENGTHS]
    if loss:
        cases += [Case(op, LOSS_LENGTH, r, m, loss=True) for r in REQUESTERS for m in MODES for op in OPS]
    if rnr:
        cases += [Case(op, 4096, r, m, rnr=True) for r in REQUESTERS for m in MODES for op in ("send", "write_imm")]
    return cases


class DropOnce:
    """Loses the first data packet (not an ACK or CNP) with this PSN going this way."""

    def __init__(self, direction: str, psn: int) -> None:
        self.direction, self.psn, self.done = direction, psn, False

    def __call__(self, direction: str, transport) -> bool:
        if self.done or direction != self.direction or transport[0] in (wire.ACKNOWLEDGE, wire.CNP):
            return False
        if (transport[9] << 16 | transport[10] << 8 | transport[11]) != self.psn:
            return False
        self.done = True
        return True


def rxe_counters(link: RxeLink) -> dict[str, int]:
    """rxe's own counters (sysfs hw_counters): what it sent, retried and failed to send."""
    d = Path("/sys/class/infiniband") / link.device / "ports" / "1" / "hw_counters"
    out = {}
    for f in sorted(d.iterdir()) if d.is_dir() else []:
        try:
            out[f.name] = int(f.read_text())
        except (OSError, ValueError):
            continue
    return out


class RxePeer:
    """The rxe device through pyverbs: one context, PD and CQ for all cases."""

    def __init__(self, link: RxeLink) -> None:
        from pyverbs.cq import CQ
        from pyverbs.device import Context
        from pyverbs.pd import PD

        self.link = link
        self.ctx = Context(name=link.device)
        self.pd = PD(self.ctx)
        self.cq = CQ(self.ctx, 1024)

    def close(self) -> None:
        self.ctx.close()

    def qp(self, size: int, psn: int) -> "RxeQp":
        return RxeQp(self, size, psn)

    def poll(self) -> list:
        _, wcs = self.cq.poll(64)
        return wcs

    def completion(self, wc) -> Completion:
        """An ibv_wc in the soft-NIC's names; immediate data in host order."""
        import pyverbs.enums as e

        return Completion(_RXE_OPCODES.get(wc.opcode, str(wc.opcode)),
                          SUCCESS if wc.status == e.IBV_WC_SUCCESS else f"ibv_wc_status_{wc.status}", wc.byte_len,
                          socket.ntohl(wc.imm_data) if wc.wc_flags & e.IBV_WC_WITH_IMM else None)


class RxeQp:
    """One RC QP on rxe with a region of ``size`` bytes (all access rights)."""

    def __init__(self, peer: RxePeer, size: int, psn: int) -> None:
        import pyverbs.enums as e
        from pyverbs.mr import MR
        from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr

        self.e = e
        self.peer = peer
        self.psn = psn
        access = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ
        self.mr = MR(peer.pd, max(size, 1), access)
        cap = QPCap(max_send_wr=16, max_recv_wr=16, max_send_sge=1, max_recv_sge=1)
        init = QPAttr(port_num=1)
        init.qp_access_flags = access  # set on the way to INIT: RTR and RTS do not carry it
        self.qp = QP(peer.pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=peer.cq, rcq=peer.cq, cap=cap), init)
        self.qpn = self.qp.qp_num
        self._attr = QPAttr

    def connect(self, dqpn: int, remote_psn: int) -> None:
        from pyverbs.addr import AHAttr, GID, GlobalRoute

        e = self.e
        attr = self._attr(port_num=1)
        attr.path_mtu = e.IBV_MTU_1024
        attr.dest_qp_num = dqpn
        attr.rq_psn = remote_psn
        attr.sq_psn = self.psn
        attr.max_dest_rd_atomic = 16
        attr.max_rd_atomic = 16
        attr.min_rnr_timer = RNR_TIMER
        attr.timeout = 14  # 4.096 us x 2^14: 67 ms
        attr.retry_cnt = 7
        attr.rnr_retry = 7  # forever
        gr = GlobalRoute(dgid=GID(ipaddress.IPv6Address(f"::ffff:{self.peer.link.nic_ip}").exploded), sgid_index=self.peer.link.gid_index)
        attr.ah_attr = AHAttr(port_num=1, is_global=1, gr=gr)
        self.qp.to_rts(attr)

    def _sge(self, length: int):
        from pyverbs.wr import SGE

        return SGE(self.mr.buf, length, self.mr.lkey)

    def post(self, op: str, length: int, remote_va: int = 0, rkey: int = 0) -> None:
        from pyverbs.wr import SendWR

        e = self.e
        opcode = {"write": e.IBV_WR_RDMA_WRITE, "write_imm": e.IBV_WR_RDMA_WRITE_WITH_IMM, "send": e.IBV_WR_SEND,
                  "send_imm": e.IBV_WR_SEND_WITH_IMM, "read": e.IBV_WR_RDMA_READ}[op]
        wr = SendWR(wr_id=1, opcode=opcode, num_sge=1, sg=[self._sge(length)], send_flags=e.IBV_SEND_SIGNALED)
        if op.endswith("_imm"):
            wr.imm_data = socket.htonl(IMM)
        if op in ("write", "write_imm", "read"):
            wr.set_wr_rdma(rkey, remote_va)
        self.qp.post_send(wr, None)

    def post_recv(self, length: int) -> None:
        from pyverbs.wr import RecvWR

        self.qp.post_recv(RecvWR(wr_id=2, num_sge=1, sg=[self._sge(max(length, 1))]), None)

    def close(self) -> None:
        self.qp.close()
        self.mr.close()


_RXE_OPCODES = {0: "send", 1: "write", 2: "read", 128: "recv", 129: "recv_rdma_with_imm"}  # ibv_wc_opcode


class Rig:
    """The soft-NIC (in the link's namespace) and the rxe peer, ready to run cases."""

    def __init__(self, link: RxeLink) -> None:
        self.link = link
        with netns.entered(link.namespace):
            self.nic = SoftNic(link.nic_ip)
        self.rxe = RxePeer(link)
        self._rnd = random.Random(17)

    def close(self) -> None:
        self.nic.close()
        self.rxe.close()

    def run(self, case: Case, timeout: float = CASE_TIMEOUT_S) -> Outcome:
        link, nic, rnd = self.link, self.nic, self._rnd
        data = rnd.randbytes(case.length)
        nic_psn, rxe_psn = rnd.randrange(1 << 24), rnd.randrange(1 << 24)
        cfg = QpConfig(mode=case.mode, mtu=link.path_mtu, min_rnr_timer=RNR_TIMER, rto_min=RTO_MIN_S)
        with netns.entered(link.namespace):
            sq = nic.create_qp(link.rxe_ip, cfg, initial_psn=nic_psn, qpn=self._free_qpn())
        rq = self.rxe.qp(case.length, rxe_psn)
        try:
            return self._run(case, data, sq, rq, timeout)
        finally:
            # The soft-NIC's QP stays: late duplicates (a READ asked again whose first answer
            # came after all) reach it and are counted there, not as packets for no QP.
            nic.lose = None
            rq.close()

    def _free_qpn(self) -> int:
        while True:
            qpn = self._rnd.randrange(0x1000, 1 << 24)
            if qpn not in self.nic.qps:
                return qpn

    def _run(self, case: Case, data: bytes, sq: QueuePair, rq: RxeQp, timeout: float) -> Outcome:
        nic = self.nic
        sq.connect(rq.qpn, rq.psn, sack=False)  # rxe offers no extension: standard semantics
        rq.connect(sq.qpn, sq.ipsn)
        n = case.length
        receives = case.op in ("send", "send_imm", "write_imm")
        drops_before = dict(nic.counters.dropped)
        rxe_before = rxe_counters(self.link)
        region = nic.pd.register(bytearray(n), va=0x1_0000_0000 + self._rnd.randrange(1 << 32) * 4096,
                                 rkey=self._rnd.randrange(1 << 32))
        got = bytearray(n)  # the soft-NIC's receive or READ buffer
        req_wcs: list[Completion] = []
        resp_wcs: list[Completion] = []
        if case.requester == "softnic":
            stream_psn = sq.ipsn  # the data packets: the soft-NIC's requests, or rxe's READ responses
            direction = "rx" if case.op == "read" else "tx"
            if case.op == "read":
                rq.mr.write(data, n)
                sq.post_read(1, got, rq.mr.buf, rq.mr.rkey)
            else:
                if receives and not case.rnr:
                    rq.post_recv(n)
                imm = IMM if case.op.endswith("_imm") else None
                if case.op.startswith("write"):
                    sq.post_write(1, data, rq.mr.buf, rq.mr.rkey, imm=imm)
                else:
                    sq.post_send(1, data, imm=imm)
        else:
            stream_psn = rq.psn
            direction = "tx" if case.op == "read" else "rx"
            if case.op == "read":
                region.buffer[:] = data
            else:
                rq.mr.write(data, n)
                if receives and not case.rnr:
                    sq.post_recv(2, bytearray(0) if case.op == "write_imm" else got)
            rq.post(case.op, n, region.va, region.rkey)
        if case.loss:
            nic.lose = DropOnce(direction, (stream_psn + LOSS_INDEX) % wire.PSN_MOD)
        rnr_posted = not case.rnr
        start = time.monotonic()
        end = start + timeout

        def finished() -> bool:
            if not req_wcs:
                return False
            return req_wcs[0].status != SUCCESS or not receives or bool(resp_wcs)

        while not finished() and time.monotonic() < end:
            nic.step(0.002)
            for wc in self.rxe.poll():
                c = self.rxe.completion(wc)
                if wc.opcode >= 128:  # IBV_WC_RECV and after: the receive side's
                    (resp_wcs if case.requester == "softnic" else req_wcs).append(c)
                else:
                    (req_wcs if case.requester == "rxe" else resp_wcs).append(c)
            for wc in sq.send_cq.poll():
                req_wcs.append(Completion(wc.opcode, wc.status, wc.byte_len))
            for wc in sq.recv_cq.poll():
                resp_wcs.append(Completion(wc.opcode, wc.status, wc.byte_len, wc.imm))
            if not rnr_posted:
                if case.requester == "softnic" and sq.stats.rnr_naks_received:
                    rq.post_recv(n)
                    rnr_posted = True
                elif case.requester == "rxe" and sq.stats.dropped.get("rnr", 0):
                    sq.post_recv(2, bytearray(0) if case.op == "write_imm" else got)
                    rnr_posted = True
        seconds = time.monotonic() - start
        problems = self._check(case, data, got, region, rq, req_wcs, resp_wcs, seconds, timeout)
        nic_drops = {k: v - drops_before.get(k, 0) for k, v in nic.counters.dropped.items()
                     if v != drops_before.get(k, 0)}
        stray = {k: v for k, v in nic_drops.items() if not k.startswith("injected")}
        if stray:
            problems.append(f"the soft-NIC refused packets: {stray}")
        injected = sum(v for k, v in nic_drops.items() if k.startswith("injected"))
        if case.loss and injected != 1:
            problems.append(f"{injected} packets lost on purpose, not 1")
        rnr = sq.stats.rnr_naks_received if case.requester == "softnic" else sq.stats.dropped.get("rnr", 0)
        if case.rnr and not rnr:
            problems.append("no RNR NAK was sent")
        nic.pd.deregister(region)
        moved = {k: v - rxe_before.get(k, 0) for k, v in rxe_counters(self.link).items() if v != rxe_before.get(k, 0)}
        return Outcome(case, not problems, "; ".join(problems), seconds, [str(c) for c in req_wcs],
                       [str(c) for c in resp_wcs],
                       sq.stats.retransmits, sq.stats.timeouts, injected, rnr, nic_drops, moved)

    def _check(self, case: Case, data: bytes, got: bytearray, region, rq: RxeQp, req_wcs: list[Completion],
               resp_wcs: list[Completion], seconds: float, timeout: float) -> list[str]:
        n = case.length
        problems = []
        if seconds >= timeout:
            problems.append(f"not complete after {timeout:.0f} s")
        want_req = {"write": "write", "write_imm": "write", "send": "send", "send_imm": "send", "read": "read"}[case.op]
        if len(req_wcs) != 1 or (req_wcs[0].opcode, req_wcs[0].status) != (want_req, SUCCESS):
            problems.append(f"requester completions {[str(c) for c in req_wcs]}, want one {want_req} {SUCCESS}")
        elif case.op == "read" and req_wcs[0].byte_len != n:
            problems.append(f"READ completed with {req_wcs[0].byte_len} bytes, not {n}")
        if case.op in ("send", "send_imm", "write_imm"):
            want = Completion("recv_rdma_with_imm" if case.op == "write_imm" else "recv", SUCCESS, n,
                              IMM if case.op.endswith("_imm") else None)
            if resp_wcs != [want]:
                problems.append(f"responder completions {resp_wcs}, want {[want]}")
        elif resp_wcs:
            problems.append(f"unexpected responder completions {[str(c) for c in resp_wcs]}")
        # The bytes, where they belong.
        if case.requester == "softnic":
            landed = bytes(got) if case.op == "read" else rq.mr.read(n, 0) if n else b""
        else:
            landed = rq.mr.read(n, 0) if case.op == "read" else bytes(region.buffer) if case.op.startswith("write") \
                else bytes(got)
        if landed != data:
            diff = next((i for i, (a, b) in enumerate(zip(landed, data)) if a != b), min(len(landed), len(data)))
            problems.append(f"data differs from byte {diff} on")
        return problems


def goodput(rig: Rig, requester: str, op: str, size: int = 8 << 20, mode: str = "selective",
            timeout: float = 300.0) -> tuple[float, Outcome]:
    """Payload bits per second of one ``size``-byte operation, measured from post to completion."""
    out = rig.run(Case(op, size, requester, mode), timeout=timeout)
    return (size * 8 / out.seconds if out.ok and out.seconds > 0 else 0.0), out


@contextmanager
def capture(netdev: str, path: Path, ns: str | None = None) -> Iterator[None]:
    """tcpdump of every RoCEv2 packet on ``netdev`` (in namespace ``ns``, else here) into ``path``,
    for as long as the body runs."""
    # -Z root: the file stays the caller's (tcpdump would hand it to its own user, which a VM's
    # shared folder shows as whatever uid that is on the host).
    argv = ["tcpdump", "-i", netdev, "-U", "-s", "0", "-Z", "root", "-w", str(path), "udp", "port",
            str(wire.ROCE_PORT)]
    proc = subprocess.Popen(netns.command(ns, argv) if ns else argv, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stderr.readline()  # "listening on ...": from here on nothing is missed
        if "listening on" not in line:
            raise RuntimeError(f"tcpdump did not start: {line.strip() or proc.wait()}")
        yield
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
