"""Compile, load, attach and drive the switch programs of ebpf/ with bcc.

One Datapath per controller: bcc compiles the programs once (about a second) into one object
whose maps every port of every switch shares, whatever namespace it lives in. Both run in tc
(clsact): ingress on every port, egress on switch ports; none in XDP, whose native mode on veth
copies every frame larger than a page at every hop (see ebpf/tc_ingress.c).
Ports are told apart by ifindex, which the fabric plan makes unique across the fabric. Every
attach is read back from the kernel; anything missing raises.
"""
from __future__ import annotations

import ctypes as ct
import ipaddress
import os
import socket
import time
from dataclasses import dataclass

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from emulator import REPO
from emulator.bpf import structs as S
from emulator.bpf.syscall import prog_id
from emulator.errors import CapabilityError, FabricError
from emulator.fabric import capabilities, netns, rtnl
from emulator.nic import wire

EBPF_DIR = REPO / "ebpf"
# One program per file; concatenated into one compilation unit so that they share their maps
# (bcc gives its own section only to functions of the main text, so they are joined, not
# #included).
PROGRAM_FILES = ("pfc_state.c", "tc_ingress.c", "tc_egress.c")
TC_INGRESS_PROG = "bp_tc_ingress"
TC_EGRESS_PROG = "bp_tc_egress"
TC_INGRESS_PARENT = 0xFFFFFFF2  # clsact ingress
TC_EGRESS_PARENT = 0xFFFFFFF3  # clsact egress
# Which build of the programs a controller compiles, from its environment. "forward-only" only
# parses, routes, rewrites and redirects (no queue accounting, PFC, pacing, ECN, loss or
# counters): bench/forwarding.py's floor, what these hooks and the fabric's qdiscs cost any
# datapath. A fabric built so says it at up and in status; no test or user topology asks for it.
BUILD_ENV = "BACKPLANE_DATAPATH_BUILD"
BUILDS = {"full": (), "forward-only": ("-DBP_FORWARD_ONLY=1",)}

# The priorities of the wire's QoS policy (nic.wire.DSCP_*): data on the lossless priority the
# topology names, CNPs on a high one, everything else lossy.
PRIO_CNP = 6
PRIO_LOSSY = 0
# Tagger's DSCP for lossless packets that bounced, next to RoCE data's 26 (the ICRC masks TOS).
DSCP_TAGGED = 27

BCC_FIX = "sudo scripts/setup.sh (installs python3-bpfcc, clang and kernel headers bcc can use)"


@dataclass(frozen=True)
class LoadTimes:
    compile_s: float
    load_s: dict[str, float]


class Datapath:
    """The compiled programs and their maps, owned by one process."""

    def __init__(self) -> None:
        src = capabilities.bcc_kernel_source()
        if src:
            os.environ["BCC_KERNEL_SOURCE"] = src
        try:
            from bcc import BPF
        except ImportError:
            raise CapabilityError("bcc is not installed: the eBPF datapath cannot be compiled", BCC_FIX) from None
        self.build = os.environ.get(BUILD_ENV, "full")
        if self.build not in BUILDS:
            raise FabricError(f"{BUILD_ENV}={self.build!r} names no build of the datapath "
                              f"(builds: {', '.join(BUILDS)})")
        text = "".join((EBPF_DIR / f).read_text() for f in PROGRAM_FILES)
        started = time.monotonic()
        try:
            self.bpf = BPF(text=text, cflags=[f"-I{EBPF_DIR / 'include'}", "-Wno-unused-function", *BUILDS[self.build]])
        except Exception as e:  # bcc raises plain Exception; its compiler output went to stderr
            raise CapabilityError(f"bcc could not compile {', '.join(PROGRAM_FILES)}: {e}", BCC_FIX) from None
        compiled = time.monotonic()
        load: dict[str, float] = {}
        self.fds: dict[str, int] = {}
        self.pfc = None  # the PFC agent (emulator.bpf.pfc), when the fabric runs PFC
        for name in (TC_INGRESS_PROG, TC_EGRESS_PROG):
            t = time.monotonic()
            try:
                self.fds[name] = self.bpf.load_func(name, BPF.SCHED_CLS).fd
            except Exception as e:
                raise FabricError(f"loading {name}: {e}") from None
            load[name] = time.monotonic() - t
        self.load_times = LoadTimes(compiled - started, load)
        self.prog_ids = {name: prog_id(fd) for name, fd in self.fds.items()}

    def close(self) -> None:
        if self.pfc is not None:
            self.pfc.close()
            self.pfc = None
        self.bpf.cleanup()

    # --- what user space decides ---

    def table(self, name: str):
        return self.bpf[name]

    def config(self) -> S.Config:
        return self.bpf["bp_config"][ct.c_int(0)]

    def set_hash(self, hash_mode: str) -> None:
        """The ECMP hash mode; the ECN thresholds that share its map entry stay as they are."""
        cfg = self.config()
        cfg.hash_mode = S.HASH_MODES[hash_mode]
        self.bpf["bp_config"][ct.c_int(0)] = cfg

    def set_adaptive(self, on: bool, flowlet_gap_ns: int = 0) -> None:
        """Adaptive routing: flows keep their next hop until idle for ``flowlet_gap_ns``
        (emulated ns); off: every packet follows the hash over the route's slots."""
        cfg = self.config()
        cfg.adaptive, cfg.flowlet_gap_ns = int(on), min(0xFFFFFFFF, max(0, int(flowlet_gap_ns)))
        self.bpf["bp_config"][ct.c_int(0)] = cfg

    def set_ecn(self, kmin: int, kmax: int, pmax: float) -> None:
        """WRED's thresholds (bytes of the port's queue) and marking probability at kmax; the
        hash mode that shares their map entry stays as it is."""
        if not 0 <= kmin <= kmax:
            raise FabricError(f"ECN thresholds kmin {kmin} and kmax {kmax}: need 0 <= kmin <= kmax")
        cfg = self.config()
        cfg.kmin, cfg.kmax, cfg.pmax = kmin, kmax, min(S.PROB_ONE, round(pmax * S.PROB_ONE))
        self.bpf["bp_config"][ct.c_int(0)] = cfg

    def set_pfc(self, lossless: tuple[int, ...], xoff: int, xon: int, tagger_prio: int | None = None) -> None:
        """PFC's lossless priorities and its XOFF/XON thresholds (bytes of a port's ingress at
        one priority); no priorities: PFC off. ``tagger_prio``: bounced lossless packets move
        there (their DSCP rewritten to DSCP_TAGGED), None: Tagger off."""
        if lossless and not 0 < xon <= xoff:
            raise FabricError(f"PFC thresholds XOFF {xoff} and XON {xon}: need 0 < XON <= XOFF")
        if tagger_prio is not None and tagger_prio not in lossless:
            raise FabricError(f"Tagger's priority {tagger_prio} must be lossless too ({lossless})")
        cfg = self.config()
        cfg.lossless = sum(1 << p for p in lossless)
        cfg.xoff, cfg.xon = xoff, xon
        cfg.tagger_dscp, cfg.tagger_prio = (DSCP_TAGGED, tagger_prio) if tagger_prio is not None else (0, 0)
        self.bpf["bp_config"][ct.c_int(0)] = cfg

    def set_dscp_prio(self, lossless_prio: int, tagger_prio: int | None = None) -> None:
        t = self.bpf["bp_dscp_prio"]
        for dscp in range(64):
            prio = lossless_prio if dscp == wire.DSCP_DATA else PRIO_CNP if dscp == wire.DSCP_CNP else PRIO_LOSSY
            if dscp == DSCP_TAGGED and tagger_prio is not None:
                prio = tagger_prio
            t[ct.c_int(dscp)] = ct.c_uint32(prio)

    def set_port(self, ifindex: int, port: S.Port) -> None:
        if not 0 < ifindex < S.MAX_IFINDEX:
            raise FabricError(f"ifindex {ifindex} outside the datapath's 1..{S.MAX_IFINDEX - 1}")
        self.bpf["bp_ports"][ct.c_int(ifindex)] = port

    def port_entry(self, ifindex: int) -> S.Port:
        return self.bpf["bp_ports"][ct.c_int(ifindex)]

    def set_route(self, node_id: int, dst: ipaddress.IPv4Network, ifindexes: list[int]) -> None:
        if not 0 < len(ifindexes) <= S.MAX_NEXTHOPS:
            raise FabricError(f"route {dst}: {len(ifindexes)} next hops, the datapath holds 1..{S.MAX_NEXTHOPS}")
        key = S.RouteKey(32 + dst.prefixlen, node_id, int.from_bytes(dst.network_address.packed, "little"))
        route = S.Route(len(ifindexes), (ct.c_uint32 * S.MAX_NEXTHOPS)(*ifindexes))
        self.bpf["bp_routes"][key] = route

    # --- attaching to ports, each checked ---

    @staticmethod
    def _port(ipr: IPRoute, ns: str, ifname: str, what: str, index: int | None = None) -> tuple[str, int]:
        """('ns:ifname' for messages, the port's ifindex); raise if there is no such port.
        ``index``: the ifindex the caller already checked the port has."""
        where = f"{ns}:{ifname}"
        if index is not None:
            return where, index
        index = ipr.link_lookup(ifname=ifname)
        if not index:
            raise FabricError(f"{where}: no such interface to {what}")
        return where, index[0]

    def attach(self, ns: str, ipr: IPRoute, ifname: str, switch: bool, index: int | None = None) -> None:
        """The ingress program on the port, and on a switch port the egress program too; raise
        unless each reads back."""
        where, index = self._port(ipr, ns, ifname, "attach the datapath to", index)
        with netns.entered(ns):
            sock = rtnl.socket_here()
        try:
            self.attach_ingress_all(ns, sock, {index: ifname})
            if switch:
                self.attach_egress_all(ns, sock, {index: ifname})
        finally:
            sock.close()

    def attach_ingress_all(self, ns: str, sock: socket.socket, ports: dict[int, str]) -> None:
        """clsact and the ingress program (the dequeue side, PFC frames, forwarding) on every
        port (ifindex -> name) of namespace ``ns``, in one batch of netlink requests on ``sock``
        (a socket of that namespace); each port's filter read back by program id."""
        self._attach(ns, sock, ports, TC_INGRESS_PARENT, TC_INGRESS_PROG, with_clsact=True)

    def attach_egress_all(self, ns: str, sock: socket.socket, ports: dict[int, str]) -> None:
        """The egress program (the enqueue side: queue, ECN, tail drop, priorities) on ports
        that already have their clsact (attach_ingress_all), in one batch, each read back."""
        self._attach(ns, sock, ports, TC_EGRESS_PARENT, TC_EGRESS_PROG, with_clsact=False)

    def _attach(self, ns: str, sock: socket.socket, ports: dict[int, str], parent: int, name: str,
                with_clsact: bool) -> None:
        messages, what = [], []
        for index, ifname in ports.items():
            if with_clsact:
                messages.append(rtnl.tc_message("add", "clsact", index))
                what.append(f"{ns}:{ifname}: adding clsact")
            messages.append(rtnl.tc_message("add-filter", "bpf", index, 1, fd=self.fds[name], name=name,
                                            parent=parent, classid=1, direct_action=True))
            what.append(f"{ns}:{ifname}: attaching {name}")
        try:
            rtnl.request_all(sock, messages, what)
            for index, ifname in ports.items():
                got = rtnl.bpf_filters(sock, index, parent)
                if got != [(name, self.prog_ids[name])]:
                    raise FabricError(f"{ns}:{ifname}: tc {'ingress' if parent == TC_INGRESS_PARENT else 'egress'} "
                                      f"holds {got} after attaching {name} (program {self.prog_ids[name]})")
        except rtnl.RtnlError as e:
            raise FabricError(str(e)) from None

    def detach(self, ns: str, ipr: IPRoute, ifname: str) -> None:
        """Remove the clsact qdisc (with its filters) from a port; raise unless it is gone.
        Removing a fabric's namespaces does this for every port at once."""
        where, index = self._port(ipr, ns, ifname, "detach the datapath from")
        try:
            if any(q.get_attr("TCA_KIND") == "clsact" for q in ipr.get_qdiscs(index=index)):
                ipr.tc("del", "clsact", index)
        except NetlinkError as e:
            raise FabricError(f"{where}: removing clsact failed: {os.strerror(e.code)}") from None
        if any(q.get_attr("TCA_KIND") == "clsact" for q in ipr.get_qdiscs(index=index)):
            raise FabricError(f"{where}: the datapath is still attached after detaching it")

    # --- reading what the kernel counted ---

    def counters(self, ifindex: int) -> dict[str, int]:
        """The port's counters, summed over CPUs."""
        per_cpu = self.bpf["bp_counters"][ct.c_int(ifindex)]
        return {name: sum(getattr(c, name) for c in per_cpu) for name in S.COUNTER_NAMES}

    def pfc_counters(self, ifindex: int, prio: int) -> dict[str, int]:
        """PFC frames sent and received on a port at one priority, and its headroom drops."""
        per_cpu = self.bpf["bp_pfc"][ct.c_int(ifindex * S.NUM_PRIO + prio)]
        return {name: sum(getattr(c, name) for c in per_cpu) for name in S.PFC_COUNTER_NAMES}

    def ingress(self, ifindex: int, prio: int) -> dict[str, int]:
        """A port's ingress occupancy at one priority (bytes in the switch), its peak, and whether
        it holds its upstream paused."""
        i = self.bpf["bp_ingress"][ct.c_int(ifindex * S.NUM_PRIO + prio)]
        occupancy = ct.c_int64(i.bytes).value
        return {"bytes": max(0, occupancy), "max_bytes": i.max_bytes, "paused": bool(i.paused)}

    def queue(self, ifindex: int, prio: int | None = None) -> dict[str, int]:
        """A queue's accounting; ``prio`` None is the port's total. depth = enqueued - dequeued."""
        slot = S.NUM_PRIO if prio is None else prio
        q = self.bpf["bp_queues"][ct.c_int(ifindex * S.QUEUE_SLOTS + slot)]
        out = {name: getattr(q, name) for name, _ in S.Queue._fields_}
        out["depth"] = max(0, q.enq_bytes - q.deq_bytes)
        return out

    def pacing(self, ifindex: int) -> dict:
        """How the port's egress queue released frames while it was backlogged (Mininet-HiFi's
        fidelity check), counted since the maps were made: callers take the difference of two
        readings. ``counts[i]`` are the busy gaps whose gap / (charged bytes / rate) fell in
        [edges[i-1], edges[i]) (the first bin from 0, the last to infinity); busy_bytes / busy_ns
        is the rate the link achieved while backlogged (busy_ns: each gap clipped at 4.3 s).
        All zero on a port whose peer does not monitor it (no shaped switch egress)."""
        p = self.bpf["bp_pacing"][ct.c_int(ifindex)]
        counts = list(p.bins)
        return {"edges": [e / S.PACING_ONE for e in S.PACING_EDGES], "counts": counts,
                "busy_gaps": sum(counts), "busy_ns": p.busy_ns, "busy_bytes": p.busy_bytes}


def ip_be(address: str) -> int:
    """An IPv4 address as the u32 the kernel holds in network order, read on this host."""
    return int.from_bytes(socket.inet_aton(address), "little")
