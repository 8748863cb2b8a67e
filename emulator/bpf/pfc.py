"""The PFC agent: the part of 802.1Qbb the kernel programs hand to user space.

The switch programs account each port's ingress per priority and report XOFF and XON
crossings and received PFC frames through one ring buffer (ebpf/pfc_state.c). One thread of
the controller serves every namespace of the fabric:
  - XOFF crossed on port I at priority p: send a PFC frame out of I (class-enable bit p, pause
    time 0xFFFF quanta) and refresh it every half pause time while the kernel still says XOFF;
  - XON: send the same frame with pause time 0 (resume);
  - a PFC frame received on port R: shut R's gate for each enabled lossless priority (its TBF
    to 8 kbit/s) until the pause time runs out or a resume arrives, then reopen it and send a
    kick frame, without which the reopened TBF sleeps on.
It keeps per (port, priority) how long each gate stayed shut and, per PAUSE it caused, the
reaction from the kernel's XOFF crossing to the upstream gate shut (bench/pfc.py reads it).

The watchdog (SONiC pfcwd's semantics) polls the switches' gates: a lossless queue shut without
a break for detection_time while it holds packets is stormed; the kernel then acts on its
action (drop: its queued and arriving packets, and the port's ingress at that priority, are
dropped and its PAUSEs ignored; forward: its PAUSEs are ignored; alert: counted only), and
restoration_time without a PAUSE for it restores the queue. Times are the real fabric's,
dilated. Storms are injected here too: a port made to send PAUSE continuously (a stuck NIC).
Requests from the controller's thread run on the agent's thread (call()), which owns all state.
"""
from __future__ import annotations

import collections
import ctypes as ct
import heapq
import os
import socket
import struct
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Mapping

from emulator.bpf import structs as S
from emulator.errors import FabricError
from emulator.fabric import netns, queues, rtnl
from emulator.model import pfc as pfc_model
from emulator.model.plan import SWITCH_ROLES, FabricPlan, Port, Shaping

PFC_DEST = bytes.fromhex("0180c2000001")  # the MAC control multicast address (802.1Q)
MIN_FRAME = 60  # without the FCS
KICK_PAYLOAD = b"backplane kick"
# The ring is polled at least this often (s), so timers are never later than this.
MAX_POLL_S = 0.05
# How long another thread of the process may hold the interpreter while the agent waits.
SWITCH_INTERVAL_S = 0.0002
# SCHED_FIFO priority of the agent's thread: above every normal task, far below the kernel's.
REALTIME_PRIORITY = 10
# Kept per run for the reaction figure; older samples are dropped first.
MAX_SAMPLES = 100_000


def pfc_frame(src_mac: bytes, vector: int, quanta: Mapping[int, int]) -> bytes:
    """An 802.1Qbb PFC frame: ``quanta`` per priority (those in ``vector``)."""
    times = [quanta.get(p, 0) if vector >> p & 1 else 0 for p in range(S.NUM_PRIO)]
    body = struct.pack("!6s6sHHH8H", PFC_DEST, src_mac, S.ETH_P_MAC_CONTROL, S.PFC_OPCODE, vector, *times)
    return body.ljust(MIN_FRAME, b"\0")


def kick_frame(src_mac: bytes, dst_mac: bytes) -> bytes:
    return (struct.pack("!6s6sH", dst_mac, src_mac, S.ETH_P_KICK) + KICK_PAYLOAD).ljust(MIN_FRAME, b"\0")


def _mac(text: str) -> bytes:
    return bytes.fromhex(text.replace(":", ""))


@dataclass
class _PortIo:
    """What the agent needs to act on one port: its socket, gates and figures."""

    port: Port
    ns: str
    sock: socket.socket
    mac: bytes
    peer_mac: bytes
    quantum_s: float  # wall seconds of one pause quantum on this link
    gates: dict[int, queues.Gate]  # lossless priority -> its pause gate


@dataclass
class GateState:
    shut_since: float | None = None  # monotonic s
    until: float = 0.0  # the pause time runs out (monotonic s)
    paused_s: float = 0.0  # total time shut
    shuts: int = 0


@dataclass
class WatchdogConfig:
    """Times in the real fabric's seconds (the agent dilates them)."""

    enabled: bool
    action: str
    detection_s: float
    restoration_s: float
    poll_s: float

    def as_dict(self) -> dict:
        return {"enabled": self.enabled, "action": self.action, "detection_time_s": self.detection_s,
                "restoration_time_s": self.restoration_s, "poll_interval_s": self.poll_s}


@dataclass
class Storm:
    """One storm the watchdog saw on a queue: wall monotonic seconds."""

    port: str
    prio: int
    action: str
    paused_at: float  # the gate shut, and stayed shut
    detected_at: float
    restored_at: float | None = None
    last_pause_at: float | None = None  # the last PAUSE before restoration

    def as_dict(self) -> dict:
        return {"port": self.port, "prio": self.prio, "action": self.action, "paused_at": self.paused_at,
                "detected_at": self.detected_at, "restored_at": self.restored_at,
                "last_pause_at": self.last_pause_at}


@dataclass
class Injection:
    """A port made to send PAUSE without end (a stuck NIC): wall monotonic seconds."""

    port: str
    prio: int
    started_at: float
    until: float  # inf: until stopped
    ended_at: float | None = None
    frames: int = 0

    def as_dict(self) -> dict:
        return {"port": self.port, "prio": self.prio, "started_at": self.started_at,
                "until": None if self.until == float("inf") else self.until, "ended_at": self.ended_at,
                "frames": self.frames}


@dataclass
class AgentStats:
    pause_sent: int = 0
    resume_sent: int = 0
    refreshes: int = 0
    gates_shut: int = 0
    gates_opened: int = 0
    expired: int = 0  # gates reopened because the pause time ran out
    errors: list[str] = field(default_factory=list)


class PfcAgent:
    """Serves the fabric's PFC from one thread; ``close()`` stops it."""

    def __init__(self, bpf, plan: FabricPlan) -> None:
        self.bpf = bpf
        self.plan = plan
        spec = plan.spec
        self.lossless = spec.pfc.lossless
        self.stats = AgentStats()
        self.gates: dict[tuple[int, int], GateState] = {}
        self.reactions_ns: list[int] = []  # XOFF crossing -> upstream gate shut
        self._xoff_at: dict[tuple[int, int], int] = {}  # (upstream port, prio) -> kernel ns of the XOFF
        self._timers: list[tuple[float, int, str, int, int]] = []
        self._seq = 0
        self._refreshing: set[tuple[int, int]] = set()  # (port, prio) with a refresh pending
        self.realtime: bool | None = None
        self._io: dict[int, _PortIo] = {}
        self._netlink: dict[str, socket.socket] = {}
        for port in plan.ports():
            if not plan.pfc_port(port) or not isinstance(port.egress, Shaping):
                continue
            ns = plan.netns(port.node)
            with netns.entered(ns):
                sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
                if ns not in self._netlink:
                    self._netlink[ns] = rtnl.socket_here()
            sock.bind((port.ifname, 0))
            kind = plan.link_of(port).kind
            where = f"{ns}:{port.ifname}"
            gates = {p: queues.Gate(self._netlink[ns], port.ifindex, p, queues.open_gate(port.egress.rate_bps, spec.mtu),
                                    port.egress.lossless_limit, spec.mtu, where) for p in self.lossless}
            self._io[port.ifindex] = _PortIo(port, ns, sock, _mac(port.mac), _mac(plan.peer(port).mac),
                                             pfc_model.quantum_s(spec, kind), gates)
        wd = spec.pfc.watchdog
        self.watchdog = WatchdogConfig(wd.enabled, wd.action, wd.detection_time, wd.restoration_time,
                                       wd.poll_interval)
        self.storms: list[Storm] = []
        self.injections: dict[tuple[int, int], Injection] = {}
        self.injected: list[Injection] = []
        self._commands: collections.deque = collections.deque()
        if self.watchdog.enabled:
            self._timer(time.monotonic() + self._wall(self.watchdog.poll_s), "watch", 0, 0)
        self._stop = threading.Event()
        # The agent shares its process with the controller's requests: without this it could
        # wait a whole 5 ms switch interval for the interpreter after the kernel woke it.
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        self.bpf["bp_events"].open_ring_buffer(self._on_event)
        self._thread = threading.Thread(target=self._run, name="pfc-agent", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        for io in self._io.values():
            io.sock.close()
        for sock in self._netlink.values():
            sock.close()

    # --- the thread ---

    def _wall(self, real_s: float) -> float:
        return self.plan.spec.emulated_time(real_s)

    def call(self, fn, timeout: float = 10.0):
        """Run ``fn()`` on the agent's thread, which owns the state, and return its result."""
        done = threading.Event()
        box: dict = {}

        def run() -> None:
            try:
                box["value"] = fn()
            except Exception as e:  # noqa: BLE001 - handed back to the caller
                box["error"] = e
            done.set()

        self._commands.append(run)
        if not done.wait(timeout):
            raise TimeoutError("the PFC agent did not answer")
        if "error" in box:
            raise box["error"]
        return box.get("value")

    def _run(self) -> None:
        # A switch's MAC reacts to PAUSE within a frame; this thread stands in for it on a
        # machine whose cores the soft-NICs keep busy, so it runs real-time (it mostly sleeps).
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(REALTIME_PRIORITY))
            self.realtime = True
        except (OSError, AttributeError) as e:
            self.realtime = False
            self._error(f"the agent runs without real-time priority ({e}): its reaction is the "
                        "scheduler's, and headroom drops may follow; run as root")
        while not self._stop.is_set():
            timeout = MAX_POLL_S
            if self._timers:
                timeout = min(timeout, max(0.0, self._timers[0][0] - time.monotonic()))
            if self._commands:
                timeout = 0.0
            self.bpf.ring_buffer_poll(max(1, int(timeout * 1000)) if timeout else 0)
            while self._commands:
                self._commands.popleft()()
            self._due(time.monotonic())

    def _on_event(self, ctx, data, size) -> int:  # noqa: ARG002 - bcc's callback signature
        ev = ct.cast(data, ct.POINTER(S.Event)).contents
        try:
            if ev.kind == S.EV_XOFF:
                self._xoff(ev.ifindex, ev.prio, ev.ns)
            elif ev.kind == S.EV_XON:
                self._send(ev.ifindex, ev.prio, 0)
            elif ev.kind == S.EV_PFC:
                self._received(ev.ifindex, ev.vector, list(ev.quanta))
        except (OSError, FabricError) as e:
            self._error(f"event {ev.kind} on port {ev.ifindex}: {e}")
        return 0

    def _error(self, what: str) -> None:
        if len(self.stats.errors) < 100:
            self.stats.errors.append(what)

    def _timer(self, due: float, kind: str, ifindex: int, prio: int) -> None:
        self._seq += 1
        heapq.heappush(self._timers, (due, self._seq, kind, ifindex, prio))

    def _due(self, now: float) -> None:
        while self._timers and self._timers[0][0] <= now:
            _, _, kind, ifindex, prio = heapq.heappop(self._timers)
            try:
                if kind == "refresh":
                    self._refreshing.discard((ifindex, prio))
                    self._refresh(ifindex, prio)
                elif kind == "expire":
                    gate = self.gates.get((ifindex, prio))
                    if gate and gate.shut_since is not None and gate.until <= now:
                        self.stats.expired += 1
                        self._open(ifindex, prio, now)
                elif kind == "watch":
                    if self.watchdog.enabled:
                        self._watch(now)
                        self._timer(now + self._wall(self.watchdog.poll_s), "watch", 0, 0)
                elif kind == "storm":
                    self._storm_tick(ifindex, prio, now)
            except (OSError, FabricError) as e:
                self._error(f"{kind} on port {ifindex}: {e}")

    # --- sending PAUSE upstream ---

    def _xoff(self, ifindex: int, prio: int, ns: int) -> None:
        io = self._io.get(ifindex)
        if io is None:
            return
        peer = self.plan.peer(io.port).ifindex
        self._xoff_at[(peer, prio)] = ns
        self._send(ifindex, prio, pfc_model.XOFF_QUANTA)

    def _send(self, ifindex: int, prio: int, quanta: int) -> None:
        io = self._io.get(ifindex)
        if io is None:
            return
        io.sock.send(pfc_frame(io.mac, 1 << prio, {prio: quanta}))
        if quanta:
            self.stats.pause_sent += 1
            if (ifindex, prio) not in self._refreshing:
                self._refreshing.add((ifindex, prio))
                self._timer(time.monotonic() + quanta * io.quantum_s / 2, "refresh", ifindex, prio)
        else:
            self.stats.resume_sent += 1

    def _refresh(self, ifindex: int, prio: int) -> None:
        """Half the pause time is gone: pause again while the kernel still holds XOFF."""
        state = self.bpf["bp_ingress"][ct.c_int(ifindex * S.NUM_PRIO + prio)]
        if state.paused:
            self.stats.refreshes += 1
            self._send(ifindex, prio, pfc_model.XOFF_QUANTA)

    # --- obeying PAUSE from downstream ---

    def _received(self, ifindex: int, vector: int, quanta: list[int]) -> None:
        io = self._io.get(ifindex)
        if io is None:
            return
        now = time.monotonic()
        for prio in self.lossless:
            if not vector >> prio & 1:
                continue
            if quanta[prio]:
                gate = self.gates.setdefault((ifindex, prio), GateState())
                gate.until = now + quanta[prio] * io.quantum_s
                if gate.shut_since is None:
                    io.gates[prio].shut()
                    gate.shut_since = time.monotonic()
                    gate.shuts += 1
                    self.stats.gates_shut += 1
                    xoff = self._xoff_at.pop((ifindex, prio), None)
                    if xoff is not None and len(self.reactions_ns) < MAX_SAMPLES:
                        self.reactions_ns.append(time.monotonic_ns() - xoff)
                self._timer(gate.until, "expire", ifindex, prio)
            else:
                self._open(ifindex, prio, now)

    def _open(self, ifindex: int, prio: int, now: float) -> None:
        gate = self.gates.get((ifindex, prio))
        if gate is None or gate.shut_since is None:
            return
        io = self._io[ifindex]
        io.gates[prio].open()
        io.sock.send(kick_frame(io.mac, io.peer_mac))
        gate.paused_s += time.monotonic() - gate.shut_since
        gate.shut_since = None
        self.stats.gates_opened += 1

    # --- the watchdog ---

    def _wd_key(self, ifindex: int, prio: int) -> ct.c_int:
        return ct.c_int(ifindex * S.NUM_PRIO + prio)

    def _watch(self, now: float) -> None:
        """One poll: storms detected and restored (SONiC's pfcwd loop)."""
        wd_map = self.bpf["bp_wd"]
        detect, restore = self._wall(self.watchdog.detection_s), self._wall(self.watchdog.restoration_s)
        for (ifindex, prio), gate in list(self.gates.items()):
            io = self._io[ifindex]
            if self.plan.node(io.port.node).role not in SWITCH_ROLES:
                continue  # a NIC's own queues: the switch's watchdog guards the fabric
            state = wd_map[self._wd_key(ifindex, prio)]
            if not state.stormed:
                if gate.shut_since is not None and now - gate.shut_since >= detect and self._depth(ifindex, prio):
                    self._storm_detected(ifindex, prio, gate, now)
                continue
            last = state.last_pause_ns / 1e9
            if time.monotonic() - last >= restore:
                state.stormed = 0
                wd_map[self._wd_key(ifindex, prio)] = state
                storm = next((s for s in reversed(self.storms) if (s.port, s.prio) == (self._name(ifindex), prio)
                              and s.restored_at is None), None)
                if storm is not None:
                    storm.restored_at, storm.last_pause_at = now, last

    def _depth(self, ifindex: int, prio: int) -> int:
        q = self.bpf["bp_queues"][ct.c_int(ifindex * S.QUEUE_SLOTS + prio)]
        return max(0, ct.c_int64(q.enq_bytes - q.deq_bytes).value)

    def _name(self, ifindex: int) -> str:
        port = self._io[ifindex].port
        return f"{port.node}:{port.ifname}"

    def _storm_detected(self, ifindex: int, prio: int, gate: GateState, now: float) -> None:
        action = self.watchdog.action
        state = S.Watchdog(1, S.WD_ACTIONS[action], self.bpf["bp_wd"][self._wd_key(ifindex, prio)].last_pause_ns)
        self.bpf["bp_wd"][self._wd_key(ifindex, prio)] = state
        self.storms.append(Storm(self._name(ifindex), prio, action, gate.shut_since, now))
        if action != "alert":
            self._open(ifindex, prio, now)  # its PAUSEs are ignored from here on

    def set_watchdog(self, **changes) -> dict:
        """pfcwd start/stop: change the config; stopping restores every stormed queue."""
        def apply() -> dict:
            was = self.watchdog.enabled
            for key, value in changes.items():
                if value is not None:
                    setattr(self.watchdog, key, value)
            if self.watchdog.enabled and not was:
                self._timer(time.monotonic() + self._wall(self.watchdog.poll_s), "watch", 0, 0)
            if not self.watchdog.enabled:
                now = time.monotonic()
                for key in list(self.gates):
                    k = self._wd_key(*key)
                    state = self.bpf["bp_wd"][k]
                    if state.stormed:
                        state.stormed = 0
                        self.bpf["bp_wd"][k] = state
                        for storm in self.storms:
                            if (storm.port, storm.prio) == (self._name(key[0]), key[1]) and storm.restored_at is None:
                                storm.restored_at = now
            return self.watchdog.as_dict()

        return self.call(apply)

    def watchdog_stats(self, counters) -> list[dict]:
        """Per lossless queue of every switch port: SONiC's `pfcwd show stats` columns."""
        rows = []
        for ifindex, io in self._io.items():
            if self.plan.node(io.port.node).role not in SWITCH_ROLES:
                continue
            for prio in self.lossless:
                c = counters(ifindex, prio)
                name = self._name(ifindex)
                storms = [s for s in self.storms if (s.port, s.prio) == (name, prio)]
                state = self.bpf["bp_wd"][self._wd_key(ifindex, prio)]
                rows.append({"queue": f"{name}:{prio}", "status": "stormed" if state.stormed else "operational",
                             "storm_detected": len(storms),
                             "storm_restored": sum(1 for s in storms if s.restored_at is not None),
                             "tx_ok": c["wd_tx_ok"], "tx_drop": c["wd_tx_drop"], "rx_ok": c["wd_rx_ok"],
                             "rx_drop": c["wd_rx_drop"], "pause_ignored": c["pause_ignored"]})
        return rows

    # --- injected storms ---

    def inject_storm(self, ifindex: int, prio: int, for_real_s: float | None) -> dict:
        """Make port ``ifindex`` send PAUSE for ``prio`` without end, or for ``for_real_s``."""
        if ifindex not in self._io:
            raise KeyError(ifindex)

        def start() -> dict:
            now = time.monotonic()
            until = now + self._wall(for_real_s) if for_real_s else float("inf")
            inj = Injection(self._name(ifindex), prio, now, until)
            self.injections[(ifindex, prio)] = inj
            self.injected.append(inj)
            self._storm_tick(ifindex, prio, now)
            return inj.as_dict()

        return self.call(start)

    def stop_storm(self, ifindex: int, prio: int) -> dict | None:
        def stop() -> dict | None:
            inj = self.injections.pop((ifindex, prio), None)
            if inj is None:
                return None
            inj.ended_at = time.monotonic()
            return inj.as_dict()

        return self.call(stop)

    def _storm_tick(self, ifindex: int, prio: int, now: float) -> None:
        inj = self.injections.get((ifindex, prio))
        if inj is None:
            return
        if now >= inj.until:
            inj.ended_at = now
            del self.injections[(ifindex, prio)]
            return
        io = self._io[ifindex]
        io.sock.send(pfc_frame(io.mac, 1 << prio, {prio: pfc_model.XOFF_QUANTA}))
        inj.frames += 1
        # A stuck NIC repeats its PAUSE long before it runs out.
        self._timer(min(inj.until, now + pfc_model.XOFF_QUANTA * io.quantum_s / 4), "storm", ifindex, prio)

    # --- what status and stats show ---

    def paused_s(self, ifindex: int, prio: int) -> float:
        gate = self.gates.get((ifindex, prio))
        if gate is None:
            return 0.0
        extra = time.monotonic() - gate.shut_since if gate.shut_since is not None else 0.0
        return gate.paused_s + extra

    def summary(self) -> dict:
        """The agent's work and its reaction, XOFF crossed to the upstream gate shut (wall s)."""
        r = sorted(self.reactions_ns)

        def pct(q: float) -> float | None:
            return r[min(len(r) - 1, int(q * len(r)))] / 1e9 if r else None

        return {"realtime": self.realtime, "pause_sent": self.stats.pause_sent,
                "resume_sent": self.stats.resume_sent, "refreshes": self.stats.refreshes,
                "gates_shut": self.stats.gates_shut, "gates_opened": self.stats.gates_opened,
                "expired": self.stats.expired, "errors": list(self.stats.errors),
                "reactions": len(r), "reaction_p50_s": pct(0.5), "reaction_p99_s": pct(0.99),
                "reaction_max_s": r[-1] / 1e9 if r else None,
                "over_assumed": sum(1 for x in r if x / 1e9 > pfc_model.EMULATOR_REACTION_S),
                "watchdog": self.watchdog.as_dict(), "storms": [s.as_dict() for s in self.storms],
                "injected": [i.as_dict() for i in self.injected], "now": time.monotonic()}

    def shut(self, ifindex: int, prio: int) -> bool:
        gate = self.gates.get((ifindex, prio))
        return gate is not None and gate.shut_since is not None
