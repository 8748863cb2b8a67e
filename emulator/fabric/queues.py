"""Egress queues over netlink: install a port's shaper or delay line, and read it back.

Every qdisc is read back from the kernel after it is installed and compared with what was asked
for; a mismatch raises. Mininet's TCLink logs a failed netem and carries on; this never does.
"""
from __future__ import annotations

import os
import socket
import struct
from typing import Sequence

from pyroute2 import IPRoute
from pyroute2.netlink import NLM_F_ACK, NLM_F_REQUEST, NLMSG_ERROR
from pyroute2.netlink.rtnl import RTM_NEWQDISC
from pyroute2.netlink.rtnl.tcmsg import tcmsg
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.rtnl.tcmsg import plugins, sched_pfifo

from emulator.errors import CapabilityError, FabricError
from emulator.fabric import rtnl
from emulator.model.plan import DelayLine, Shaping
from emulator.model.spec import ETH_HEADER

# bfifo carries the same options as pfifo (one 32-bit limit, in bytes instead of packets);
# pyroute2 only names the latter.
plugins.setdefault("bfifo", sched_pfifo)

ROOT = 0x10000  # 1:
CLASS = 0x10001  # 1:1, the port's single rate class
LEAF = 0x100000  # 10:, the FIFO that holds the port's buffer
# With PFC (Shaping.priorities): leaf 1:(LEAF_BASE + p) per priority p under CLASS, each with
# its pause gate, a TBF, as qdisc GATE_BASE + p:; MAC control frames (PAUSE, kicks) in CONTROL,
# never gated, served first. The eBPF egress program picks the class by skb->priority (values
# in ebpf/include/bp_consts.h, BP_TC_*).
NUM_PRIO = 8
LEAF_BASE = 0x10
CONTROL = 0x18
GATE_BASE = 0x20
CONTROL_FIFO = 0x28
CONTROL_LIMIT_FRAMES = 64
# A gate shut: the TBF's rate and a bucket of one frame, so it lets one frame out as it closes
# (a change fills the bucket) and then one every 4.3 s. That is TBF's floor: the kernel caps the
# bucket at 2^32 ns of the rate, and drops (never delays) a frame larger than the bucket, so at
# a lower rate every frame reaching a shut gate would be lost. The bucket has a few bytes to
# spare because the kernel rounds it.
PAUSED_RATE = 1000  # bytes/s
SHUT_BURST_SPARE = 64
# An open gate never throttles: its rate is well above the port's, under HTB's ceiling.
OPEN_RATE_FACTOR = 4
MAX_RATE = 34_000_000_000 // 8


def class_id(minor: int) -> int:
    return (1 << 16) | minor


def gate_handle(prio: int) -> int:
    return (GATE_BASE + prio) << 16


def open_gate(rate_bps: int, mtu: int) -> dict:
    """The TBF parameters of an open gate on a port shaped to ``rate_bps``."""
    frame = mtu + ETH_HEADER
    rate = min(MAX_RATE, OPEN_RATE_FACTOR * rate_bps // 8)
    return {"rate": rate, "burst": max(2 * frame, int(rate * BURST_SECONDS))}


def shut_gate(mtu: int) -> dict:
    return {"rate": PAUSED_RATE, "burst": mtu + ETH_HEADER + SHUT_BURST_SPARE}


# The shaper may run ahead of its rate by this long: short enough that queues build in the
# FIFO where they are measured, long enough that timer slack does not cost throughput.
BURST_SECONDS = 100e-6


def _burst(rate_bps: int, mtu: int) -> int:
    return max(2 * (mtu + ETH_HEADER), int(rate_bps / 8 * BURST_SECONDS))


def _delayed(egress: Shaping | DelayLine, with_delay: bool) -> bool:
    return with_delay and isinstance(egress, Shaping) and egress.delay_s > 0


def install(ipr: IPRoute, index: int, egress: Shaping | DelayLine, mtu: int, where: str,
            with_delay: bool = False, check: bool = True, sock: socket.socket | None = None,
            before: Sequence[tuple[bytes, str]] = ()) -> None:
    """Install ``egress`` as the root qdisc of interface ``index``; raise unless it took (with
    ``check`` False the caller reads it back later, with check()). With ``with_delay``, a shaped
    egress that carries an in-DC delay gets it as a netem under the shaper (HTB only: TBF takes
    no child here) instead of its FIFO. ``sock``: a bare rtnetlink socket in the interface's
    namespace to send the requests on in one batch (rtnl.tc_message), instead of ``ipr``, after
    the requests ``before`` (message, what it does) of the same port."""
    delayed = _delayed(egress, with_delay)
    requests: list[tuple[str, str, int, dict]] = []

    def tc(command: str, kind: str, handle: int, **kwargs) -> None:
        requests.append((command, kind, handle, kwargs))

    if isinstance(egress, Shaping):
        rate = egress.rate_bps // 8  # bytes per second, as HTB/TBF carry it
        burst = _burst(egress.rate_bps, mtu)
        frame = mtu + ETH_HEADER
        if egress.priorities:
            _install_priorities(tc, egress, mtu, where, delayed)
        elif egress.shaper == "htb":
            tc("add", "htb", ROOT, default=1)
            tc("add-class", "htb", CLASS, parent=ROOT, rate=rate, ceil=rate, burst=burst, cburst=burst,
               quantum=frame, mtu=frame)
            if delayed:
                tc("add", "netem", LEAF, parent=CLASS, delay=egress.delay_s * 1e6, limit=egress.delay_limit_packets)
            else:
                tc("add", "bfifo", LEAF, parent=CLASS, limit=egress.qdisc_limit)
        else:
            if delayed:
                raise FabricError(f"{where}: the in-DC delay needs a netem under the shaper; use shaper: htb")
            tc("add", "tbf", ROOT, rate=rate, burst=burst, limit=egress.qdisc_limit, mtu=frame)
    else:
        tc("add", "netem", ROOT, delay=egress.delay_s * 1e6, limit=egress.limit_packets,
           loss=egress.loss * 100, prob_corrupt=egress.corruption * 100)
    try:
        if sock is None:
            for command, kind, handle, kwargs in requests:
                ipr.tc(command, kind, index, handle, **kwargs)
        else:
            messages = [m for m, _ in before] + [rtnl.tc_message(c, k, index, h, **kw) for c, k, h, kw in requests]
            rtnl.request_all(sock, messages, [w for _, w in before] + [f"{c} {k} {h:#x}" for c, k, h, _ in requests])
    except (NetlinkError, rtnl.RtnlError) as e:
        code = e.code if isinstance(e, NetlinkError) else e.errno
        kind = "netem" if isinstance(egress, DelayLine) or delayed else egress.shaper
        if code == 2:  # ENOENT: the kernel has no such qdisc
            from emulator.fabric.capabilities import NETEM_FIX

            raise CapabilityError(f"{where}: the kernel has no {kind} qdisc",
                                  NETEM_FIX if kind == "netem" else f"a kernel with {kind} (CONFIG_NET_SCH_{kind.upper()})")
        if isinstance(e, rtnl.RtnlError):  # it names the request that failed
            raise FabricError(f"{where}: {e}") from None
        raise FabricError(f"{where}: adding the {kind} qdisc failed: {os.strerror(code)}") from None
    if check:
        _verify(read(ipr, index), egress, where, delayed)


def check(ipr: IPRoute, index: int, egress: Shaping | DelayLine, where: str, with_delay: bool = False,
          qdiscs: list | None = None) -> None:
    """Raise unless interface ``index`` holds ``egress`` as install() puts it; ``qdiscs``: the
    interface's qdiscs from a dump already made (a node's ports are read in one)."""
    _verify(read(ipr, index, qdiscs), egress, where, _delayed(egress, with_delay))


def _install_priorities(tc, egress: Shaping, mtu: int, where: str, delayed: bool) -> None:
    if delayed:
        raise FabricError(f"{where}: PFC's per-priority gates and the in-DC delay line (a netem under the "
                          "shaper) are not built together yet; run PFC topologies where the kernel has no "
                          "netem need (this machine's tiers), or set latency to 0")
    rate = egress.rate_bps // 8
    frame = mtu + ETH_HEADER
    burst = _burst(egress.rate_bps, mtu)
    share = max(1, rate // (NUM_PRIO + 1))
    tc("add", "htb", ROOT, default=LEAF_BASE)
    tc("add-class", "htb", CLASS, parent=ROOT, rate=rate, ceil=rate, burst=burst, cburst=burst, quantum=frame,
       mtu=frame)
    gate = open_gate(egress.rate_bps, mtu)
    for prio in range(NUM_PRIO):
        tc("add-class", "htb", class_id(LEAF_BASE + prio), parent=CLASS, rate=share, ceil=rate, burst=burst,
           cburst=burst, quantum=frame, mtu=frame, prio=1)
        tc("add", "tbf", gate_handle(prio), parent=class_id(LEAF_BASE + prio), mtu=frame,
           limit=egress.lossless_limit, **gate)
    tc("add-class", "htb", class_id(CONTROL), parent=CLASS, rate=share, ceil=rate, burst=burst, cburst=burst,
       quantum=frame, mtu=frame, prio=0)
    tc("add", "bfifo", CONTROL_FIFO << 16, parent=class_id(CONTROL), limit=CONTROL_LIMIT_FRAMES * frame)


def set_rate(ipr: IPRoute, index: int, egress: Shaping, rate_bps: int, mtu: int, where: str) -> None:
    """Change a shaped egress to ``rate_bps`` (emulated) in place, queue and all; raise unless
    the kernel holds it afterwards. With PFC, the per-priority leaves' ceiling follows."""
    rate = rate_bps // 8
    frame = mtu + ETH_HEADER
    burst = _burst(rate_bps, mtu)
    try:
        if egress.priorities or egress.shaper == "htb":
            ipr.tc("change-class", "htb", index, CLASS, parent=ROOT, rate=rate, ceil=rate, burst=burst,
                   cburst=burst, quantum=frame, mtu=frame)
            if egress.priorities:
                share = max(1, rate // (NUM_PRIO + 1))
                for minor in [LEAF_BASE + p for p in range(NUM_PRIO)] + [CONTROL]:
                    ipr.tc("change-class", "htb", index, class_id(minor), parent=CLASS, rate=share, ceil=rate,
                           burst=burst, cburst=burst, quantum=frame, mtu=frame, prio=0 if minor == CONTROL else 1)
        else:
            ipr.tc("change", "tbf", index, ROOT, rate=rate, burst=burst, limit=egress.qdisc_limit, mtu=frame)
    except NetlinkError as e:
        raise FabricError(f"{where}: changing the {egress.shaper} rate failed: {os.strerror(e.code)}") from None
    got = read(ipr, index)
    if abs(got.get("rate_bps", 0) - rate_bps) > 8:
        raise FabricError(f"{where}: the kernel holds {got.get('rate_bps')} b/s after setting {rate_bps}")


def set_delay_line(ipr: IPRoute, index: int, line: DelayLine, where: str) -> None:
    """Change a fiber's netem delay line (delay, loss, corruption) in place; raise unless the
    kernel holds it afterwards."""
    try:
        ipr.tc("change", "netem", index, ROOT, delay=line.delay_s * 1e6, limit=line.limit_packets,
               loss=line.loss * 100, prob_corrupt=line.corruption * 100)
    except NetlinkError as e:
        raise FabricError(f"{where}: changing the netem delay line failed: {os.strerror(e.code)}") from None
    got = read(ipr, index)
    _verify(got, line, where)
    if abs(got.get("corruption", 0) - line.corruption) > 1e-6:
        raise FabricError(f"{where}: the kernel holds corruption {got.get('corruption')} after setting "
                          f"{line.corruption}")


def gates(ipr: IPRoute, index: int, qdiscs: list | None = None) -> dict[int, int]:
    """Each priority's pause gate as the kernel holds it: priority -> TBF rate, bytes/s."""
    out = {}
    for q in ipr.get_qdiscs(index=index) if qdiscs is None else qdiscs:
        minor_parent = q["parent"] & 0xFFFF
        if q.get_attr("TCA_KIND") == "tbf" and LEAF_BASE <= minor_parent < LEAF_BASE + NUM_PRIO:
            out[minor_parent - LEAF_BASE] = q.get_attr("TCA_OPTIONS").get_attr("TCA_TBF_PARMS")["rate"]
    return out




class Gate:
    """One priority's pause gate on one port, switched by netlink messages built once: a change
    costs a few microseconds this way, against half a millisecond through pyroute2's tc()."""

    def __init__(self, sock: socket.socket, index: int, prio: int, open_params: dict, limit: int, mtu: int,
                 where: str) -> None:
        self.sock, self.where = sock, where
        self._shut = self._message(index, prio, shut_gate(mtu), limit, mtu)
        self._open = self._message(index, prio, open_params, limit, mtu)

    @staticmethod
    def _message(index: int, prio: int, params: dict, limit: int, mtu: int) -> bytes:
        msg = tcmsg()
        msg["family"], msg["index"] = 0, index
        msg["handle"], msg["parent"] = gate_handle(prio), class_id(LEAF_BASE + prio)
        opts = plugins["tbf"].get_parameters(dict(params, limit=limit, mtu=mtu + ETH_HEADER))
        msg["attrs"] = [("TCA_KIND", "tbf"), ("TCA_OPTIONS", opts)]
        msg["header"]["type"] = RTM_NEWQDISC  # without NLM_F_CREATE: change the existing one
        msg["header"]["flags"] = NLM_F_REQUEST | NLM_F_ACK
        msg.encode()
        return bytes(msg.data)

    def shut(self) -> None:
        self._send(self._shut, "shutting")

    def open(self) -> None:
        self._send(self._open, "opening")

    def _send(self, message: bytes, what: str) -> None:
        self.sock.send(message)
        reply = self.sock.recv(65536)
        kind, error = struct.unpack_from("=H", reply, 4)[0], struct.unpack_from("=i", reply, 16)[0]
        if kind != NLMSG_ERROR or error:
            raise FabricError(f"{self.where}: {what} the pause gate failed: "
                              f"{os.strerror(-error) if error else f'netlink reply type {kind}'}")


def read(ipr: IPRoute, index: int, qdiscs: list | None = None) -> dict:
    """What the kernel has on this egress, in base units; ``qdiscs``: the interface's qdiscs
    from a dump already made."""
    listed = ipr.get_qdiscs(index=index) if qdiscs is None else qdiscs
    qdiscs = {q["handle"]: q for q in listed}
    root = next((q for q in qdiscs.values() if q["parent"] == 0xFFFFFFFF), None)
    if root is None:
        return {"kind": "none"}
    kind = root.get_attr("TCA_KIND")
    out: dict = {"kind": kind}
    if kind == "htb":
        all_classes = ipr.get_classes(index=index)
        classes = [c for c in all_classes if c["handle"] == CLASS]
        leaves = sorted(c["handle"] & 0xFFFF for c in all_classes if c["parent"] == CLASS)
        if leaves:
            out["leaves"] = leaves
            out["gates"] = gates(ipr, index, listed)
            control = qdiscs.get(CONTROL_FIFO << 16)
            out["control_fifo"] = control.get_attr("TCA_KIND") if control is not None else None
        if classes:
            parms = classes[0].get_attr("TCA_OPTIONS").get_attr("TCA_HTB_PARMS")
            out["rate_bps"] = parms["rate"] * 8
            out["ceil_bps"] = parms["ceil"] * 8
        leaf = qdiscs.get(LEAF)
        if leaf is not None:
            out["fifo"] = leaf.get_attr("TCA_KIND")
            if out["fifo"] == "netem":
                opts = leaf.get_attr("TCA_OPTIONS")
                out["limit_packets"] = opts["limit"]
                out["delay_s"] = _netem_delay(opts)
            else:
                out["limit_bytes"] = leaf.get_attr("TCA_OPTIONS")["limit"]
    elif kind == "tbf":
        parms = root.get_attr("TCA_OPTIONS").get_attr("TCA_TBF_PARMS")
        out["rate_bps"] = parms["rate"] * 8
        out["limit_bytes"] = parms["limit"]
    elif kind == "netem":
        opts = root.get_attr("TCA_OPTIONS")
        out["limit_packets"] = opts["limit"]
        out["loss"] = opts["loss"] / 0xFFFFFFFF
        corrupt = opts.get_attr("TCA_NETEM_CORRUPT") if hasattr(opts, "get_attr") else None
        out["corruption"] = (corrupt["prob_corrupt"] / 0xFFFFFFFF) if corrupt else 0.0
        out["delay_s"] = _netem_delay(opts)
    return out


def _netem_delay(opts) -> float:
    latency64 = opts.get_attr("TCA_NETEM_LATENCY64") if hasattr(opts, "get_attr") else None
    if latency64 is not None:
        return latency64 / 1e9
    from pyroute2.netlink.rtnl.tcmsg.common import tick_in_usec

    return opts["delay"] / tick_in_usec / 1e6


def _verify(got: dict, want: Shaping | DelayLine, where: str, delayed: bool = False) -> None:
    def fail(what: str) -> FabricError:
        return FabricError(f"{where}: the kernel holds {got} after installing {want}: {what}")

    if isinstance(want, Shaping):
        if got.get("kind") != want.shaper:
            raise fail(f"root qdisc is {got.get('kind')}, not {want.shaper}")
        if abs(got.get("rate_bps", 0) - want.rate_bps) > 8:
            raise fail("rate differs")
        if want.priorities:
            if got.get("leaves") != [LEAF_BASE + p for p in range(NUM_PRIO)] + [CONTROL]:
                raise fail("the per-priority leaves differ")
            if sorted(got.get("gates", {})) != list(range(NUM_PRIO)) or got.get("control_fifo") != "bfifo":
                raise fail("a pause gate or the control FIFO is missing")
            return
        if delayed:
            if got.get("fifo") != "netem" or abs(got.get("delay_s", 0) - want.delay_s) > 1e-6:
                raise fail("the in-DC delay line under the shaper differs")
            if got.get("limit_packets") != want.delay_limit_packets:
                raise fail("the in-DC delay line's limit differs")
        elif got.get("limit_bytes") != want.qdisc_limit:
            raise fail("queue limit differs")
    else:
        if got.get("kind") != "netem":
            raise fail("root qdisc is not netem")
        if abs(got.get("delay_s", 0) - want.delay_s) > 1e-5:
            raise fail("delay differs")
        if got.get("limit_packets") != want.limit_packets:
            raise fail("limit differs")
        if abs(got.get("loss", 0) - want.loss) > 1e-6:
            raise fail("loss differs")


def counters(ipr: IPRoute, index: int) -> dict:
    """The root qdisc's counters as the kernel keeps them (packets, bytes, drops, backlog)."""
    root = next((q for q in ipr.get_qdiscs(index=index) if q["parent"] == 0xFFFFFFFF), None)
    stats = root.get_attr("TCA_STATS") if root is not None else None
    if stats is None:
        raise FabricError(f"interface {index} has no root qdisc counters")
    return {"packets": stats["packets"], "bytes": stats["bytes"], "drops": stats["drop"],
            "backlog_bytes": stats["backlog"]}
