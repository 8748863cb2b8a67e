"""The controller's fault agent: takes switch ports down and up on a running fabric, and plays
the control plane's reaction, withdrawing dead next hops from the datapath's ECMP groups only
after the detection delay (BFD-like, dilated) and restoring them the same way.

Every event is timed on CLOCK_MONOTONIC (one clock with the port samples and the NICs): when it
was asked for, when the datapath took it (took_effect_at), when the control plane noticed and
the ECMP groups changed (converged_at).
"""
from __future__ import annotations

import heapq
import itertools
import threading
import time
from dataclasses import asdict, dataclass, field

import dataclasses
import math

from emulator.bpf import structs as S
from emulator.errors import UsageError
from emulator.fabric import queues, routes
from emulator.faults import routing
from emulator.model import units
from emulator.model.plan import DelayLine, FabricPlan, Port, Shaping, SWITCH_ROLES
from emulator.model.spec import ETH_HEADER

# Faults that take ports down (the control plane reacts), faults that change a setting of a
# path or port (nothing to detect: packets just go slower, later or wrong), and restore.
DOWN_KINDS = ("fiber-cut", "link-flap", "switch-failure")
SETTING_KINDS = ("rate", "ber", "latency-step")
KINDS = DOWN_KINDS + SETTING_KINDS + ("restore",)
# netem's queue of a longer fiber grows with its delay; never below this many packets.
MIN_NETEM_LIMIT = 1000


@dataclass
class Fault:
    """One fault and its timeline (monotonic wall seconds; None: not yet)."""

    id: int
    kind: str
    target: str
    ports: list[str]  # "node:ifname" it takes down, the control plane's to notice
    # A cut fiber's own ports, down with it: what it held or was queued for it is lost there.
    medium: list[str] = field(default_factory=list)
    options: dict = field(default_factory=dict)
    asked_at: float = 0.0
    took_effect_at: float | None = None  # ports down in the datapath
    noticed_at: float | None = None  # the control plane saw them dead (the detection time later)
    converged_at: float | None = None  # dead next hops withdrawn from ECMP (the datapath's groups)
    routes_at: float | None = None  # ... and from the switches' kernel routes (ping, TCP) too
    restored_at: float | None = None  # ports up again
    reconverged_at: float | None = None  # next hops back in ECMP
    flaps_done: int = 0

    def as_dict(self) -> dict:
        return asdict(self)


class FaultAgent:
    """Applies faults from the controller's requests; one thread runs the timers."""

    def __init__(self, datapath, plan: FabricPlan, detection_real_s: float, ipr_of=None,
                 delay_lines: bool = False) -> None:
        """``ipr_of(node)``: the node's netlink socket (rate and delay-line changes);
        ``delay_lines``: the fibers hold netem delay lines (the VM tier), which then carry
        bit errors and latency; without them the borders' eBPF drops for the errors."""
        self.datapath, self.plan = datapath, plan
        self.ipr_of, self.delay_lines = ipr_of, delay_lines
        self.detection_real_s = detection_real_s
        self.faults: list[Fault] = []
        self.errors: list[str] = []
        self._ids = itertools.count(1)
        self._down: dict[str, set[int]] = {}  # port -> the faults holding it down now
        self._since: dict[str, float] = {}  # port -> when it last went down
        self._noticed: dict[str, set[int]] = {}  # what the control plane has seen, detection later
        self._groups = routing.ecmp_groups(plan, set())
        # Each group's kernel route: its switch, and the gateway behind each of its ports.
        self._kernel: dict[tuple, tuple[str, dict[int, str]]] = {}
        for node in plan.nodes:
            if node.role in SWITCH_ROLES:
                ports = {p.ifname: p.ifindex for p in plan.ports(node.name)}
                for route in plan.routes[node.name]:
                    self._kernel[(node.uid, route.dst)] = (node.name, {ports[dev]: gw for gw, dev in route.nexthops})
        # Adaptive routing's view (emulator/faults/adaptive.py): ports' weights in their groups,
        # and the ports it took out; the ports out of ECMP now carry BP_PORT_AVOID.
        self._weights: dict[int, float] = {}
        self._shunned: set[str] = set()
        self._avoided: set[str] = set()
        self._lines: dict[str, DelayLine] = {}  # fibers' delay lines as faults have set them
        self._ifindex = {f"{p.node}:{p.ifname}": p.ifindex for p in plan.ports()}
        self._timers: list[tuple[float, int, str, int]] = []
        self._seq = itertools.count()
        self._lock = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="fault-agent", daemon=True)
        self._thread.start()

    # --- requests (the controller's thread) ---

    def apply(self, kind: str, target: str, options: dict | None = None,
              detection_real_s: float | None = None) -> dict:
        """Apply ``kind`` to ``target`` now; returns the fault as recorded."""
        options = dict(options or {})
        if kind == "restore":
            return {"restored": self.restore(target)}
        if kind not in KINDS:
            raise UsageError(f"{kind}: this fabric's fault agent applies {', '.join(KINDS)}")
        if kind in SETTING_KINDS:
            return self._apply_setting(kind, target, options)
        ports = [f"{p.node}:{p.ifname}" for p in routing.dead_ports(self.plan, kind, target)]
        if kind == "link-flap":
            if int(options.get("count", 1)) < 1 or not float(options.get("period_s", 0)) > 0:
                raise UsageError("link-flap: give --count >= 1 and a --period above 0")
        detection = self.detection_real_s if detection_real_s is None else detection_real_s
        with self._lock:
            medium = [f"{p.node}:{p.ifname}" for p in routing.medium_ports(self.plan, kind, target)]
            fault = Fault(next(self._ids), kind, target, ports, medium, {**options, "detection_s": detection},
                          asked_at=time.monotonic())
            self.faults.append(fault)
            self._take_down(fault)
            if kind == "link-flap":
                self._schedule(fault.took_effect_at + self._wall(options["period_s"]) / 2, "flap-up", fault.id)
            self._lock.notify()
        return fault.as_dict()

    def restore(self, target: str) -> list[dict]:
        """Bring up every port a fault on ``target`` (or "all") holds down; the ECMP groups
        follow after the detection delay."""
        with self._lock:
            hit = [f for f in self.faults if f.restored_at is None and target in ("all", f.target)]
            if not hit:
                active = sorted({f.target for f in self.faults if f.restored_at is None})
                raise UsageError(f"restore: no fault on {target!r} to undo (active: {', '.join(active) or 'none'})")
            for f in hit:
                if f.kind in SETTING_KINDS:
                    self._undo_setting(f)
                else:
                    self._bring_up(f, final=True)
            self._lock.notify()
        return [f.as_dict() for f in hit]

    def summary(self) -> dict:
        with self._lock:
            return {"faults": [f.as_dict() for f in self.faults], "errors": list(self.errors), "down": sorted(p for p, s in self._down.items() if s),
                    "withdrawn": sorted(p for p, s in self._noticed.items() if s), "now": time.monotonic()}

    def groups(self) -> dict:
        """The ECMP groups as written now ((node uid, destination) -> slots' ifindexes)."""
        with self._lock:
            return dict(self._groups)

    def close(self) -> None:
        with self._lock:
            self._stop = True
            self._lock.notify()
        self._thread.join(timeout=5)

    # --- settings of a path or port: rate, bit errors, latency ---

    def _setting_ports(self, kind: str, target: str) -> list[Port]:
        """The ports whose egress a setting changes: for a path, the borders' ports onto its
        fiber (rate, and bit errors without delay lines) or the fiber's own (its delay lines)."""
        fibers = [n.name for n in self.plan.nodes if n.role == "fiber"]
        if target in fibers:
            if kind == "latency-step" or (kind == "ber" and self.delay_lines):
                return list(self.plan.ports(target))
            return [self.plan.peer(p) for p in self.plan.ports(target)]
        if kind == "rate" and ":" in target:
            node, _, ifname = target.partition(":")
            try:
                port = self.plan.port(node, ifname)
            except KeyError:
                port = None
            if port is not None and isinstance(port.egress, Shaping):
                return [port]
        raise UsageError(f"{kind}: {target!r} is not a long-haul path{' or a shaped switch port' if kind == 'rate' else ''} "
                         f"of fabric {self.plan.name!r} (its paths: {', '.join(fibers) or 'none'})")

    def _apply_setting(self, kind: str, target: str, options: dict) -> dict:
        if kind == "latency-step" and not self.delay_lines:
            raise UsageError("latency-step: this fabric's long-haul paths have no delay lines (netem) to lengthen "
                             "(up --no-wan-delay, or a kernel without sch_netem): run it in the VM tier "
                             "(backplane vm run)")
        need = {"rate": ("rate_bps",), "ber": ("ber", "corruption", "loss"), "latency-step": ("extra_m",)}[kind]
        given = [k for k in need if options.get(k) is not None]
        if len(given) != 1:
            raise UsageError(f"{kind}: give {'one of ' if len(need) > 1 else ''}{', '.join(need)}")
        value = float(options[given[0]])
        if not (0 <= value <= 1 if kind == "ber" else value > 0):
            raise UsageError(f"{kind}: {given[0]} {value:g} is out of range")
        ports = self._setting_ports(kind, target)
        with self._lock:
            fault = Fault(next(self._ids), kind, target, [f"{p.node}:{p.ifname}" for p in ports], dict(options),
                          asked_at=time.monotonic())
            for port in ports:
                self._set(kind, port, options)
            fault.took_effect_at = time.monotonic()
            self.faults.append(fault)
        return fault.as_dict()

    def _undo_setting(self, fault: Fault) -> None:
        for name in fault.ports:
            node, _, ifname = name.partition(":")
            self._set(fault.kind, self.plan.port(node, ifname), None)
        fault.restored_at = fault.reconverged_at = time.monotonic()

    def _set(self, kind: str, port: Port, options: dict | None) -> None:
        """Set ``kind`` on ``port`` from ``options`` (None: back to the plan's)."""
        spec, where = self.plan.spec, f"{port.node}:{port.ifname}"
        if kind == "rate":
            rate = port.egress.rate_bps if options is None else spec.emulated_rate(options["rate_bps"])
            queues.set_rate(self.ipr_of(port.node), port.ifindex, port.egress, rate, spec.mtu, where)
            # The port its queue drains into times its dequeues against that rate.
            peer = self.plan.peer(port)
            entry = self.datapath.port_entry(peer.ifindex)
            if entry.peer_queue == port.ifindex and entry.peer_rate:
                entry.peer_rate = rate // 8
                self.datapath.set_port(peer.ifindex, entry)
            return
        line = port.egress if isinstance(port.egress, DelayLine) else None
        path = next(w for w in spec.wan_paths
                    if w.index == self.plan.node(self.plan.peer(port).node if line is None else port.node).index)
        if kind == "ber":
            loss, corruption = path.loss, path.corruption
            if options is not None:
                frame_bits = 8 * (spec.mtu + ETH_HEADER)
                loss = options.get("loss", path.loss)
                corruption = options.get("corruption", path.corruption)
                if "ber" in options:
                    corruption = 1.0 - (1.0 - options["ber"]) ** frame_bits
            if line is not None:
                # On what the line holds now: a latency step on it stays.
                now = self._lines.get(where, line)
                self._lines[where] = dataclasses.replace(now, loss=loss, corruption=corruption)
                queues.set_delay_line(self.ipr_of(port.node), port.ifindex, self._lines[where], where)
            else:
                # No delay line: the border's egress drops what the errors would (a corrupted
                # frame fails the receiver's ICRC, which is loss to RoCE).
                entry = self.datapath.port_entry(port.ifindex)
                drop = path.loss if options is None else 1 - (1 - loss) * (1 - corruption)
                entry.loss = min(0xFFFFFFFF, round(drop * 2**32))
                self.datapath.set_port(port.ifindex, entry)
            return
        extra = 0.0 if options is None else spec.emulated_time(units.fiber_delay(options["extra_m"]))
        delay = line.delay_s + extra
        limit = max(MIN_NETEM_LIMIT, math.ceil(line.limit_packets * delay / line.delay_s)) if line.delay_s else \
            line.limit_packets
        # On what the line holds now: bit errors set on it stay.
        self._lines[where] = dataclasses.replace(self._lines.get(where, line), delay_s=delay, limit_packets=limit)
        queues.set_delay_line(self.ipr_of(port.node), port.ifindex, self._lines[where], where)

    # --- the datapath (under the lock) ---

    def _wall(self, real_s: float) -> float:
        return self.plan.spec.time.time(real_s)

    def _set_flag(self, port: str, flag: int, on: bool) -> None:
        ifindex = self._ifindex[port]
        entry = self.datapath.port_entry(ifindex)
        entry.flags = (entry.flags | flag) if on else (entry.flags & ~flag)
        self.datapath.set_port(ifindex, entry)

    def _set_down(self, port: str, down: bool) -> None:
        if down:
            self._since[port] = time.monotonic()
        self._set_flag(port, S.PORT_DOWN, down)

    def _take_down(self, fault: Fault, first: bool = True) -> None:
        for port in fault.ports + fault.medium:
            was = bool(self._down.get(port))
            self._down.setdefault(port, set()).add(fault.id)
            if not was:
                self._set_down(port, True)
        now = time.monotonic()
        if first:
            fault.took_effect_at = now
        self._schedule(now + self._wall(fault.options["detection_s"]), "notice-down", fault.id)

    def _bring_up(self, fault: Fault, final: bool) -> None:
        for port in fault.ports + fault.medium:
            held = self._down.get(port, set())
            held.discard(fault.id)
            if not held:
                self._set_down(port, False)
        now = time.monotonic()
        if final:
            fault.restored_at = now
        self._schedule(now + self._wall(fault.options["detection_s"]), "notice-up", fault.id)

    def _converge(self) -> list[tuple]:
        """Write the ECMP groups the control plane's view of dead ports and adaptive routing's
        weights leave, and mark the ports out of them (flows pinned there move at once).
        Returns the groups whose members changed, for ``_follow`` to write into the kernel."""
        out = {p for p, s in self._noticed.items() if s} | self._shunned
        groups = routing.ecmp_groups(self.plan, out)
        members = []
        for key, ifindexes in groups.items():
            groups[key] = routing.weighted_slots(ifindexes, self._weights, S.MAX_NEXTHOPS)
            if groups[key] != self._groups.get(key):
                self.datapath.set_route(key[0], key[1], groups[key])
                if set(groups[key]) != set(self._groups.get(key, ())):
                    members.append((key, list(dict.fromkeys(groups[key]))))
        self._groups = groups
        for port in out ^ self._avoided:
            self._set_flag(port, S.PORT_AVOID, port in out)
        self._avoided = out
        return members

    def _follow(self, members: list[tuple]) -> None:
        """The switches' kernel routes follow the groups' members (not their weights, which are
        the datapath's), for what does not take the datapath: ping, TCP. After the datapath,
        which is what RoCE takes: a route through pyroute2 costs a fraction of a millisecond."""
        if self.ipr_of is None:
            return
        for key, ifindexes in members:
            node, gateway = self._kernel[key]
            routes.replace_route(self.ipr_of(node), node, key[1], [(gateway[i], i) for i in ifindexes])

    def set_weights(self, weights: dict[str, float], shunned: set[str]) -> None:
        """Adaptive routing's decision: each port's weight in its groups ("node:ifname" -> w,
        1 when absent) and the ports it takes out of them."""
        with self._lock:
            self._weights = {self._ifindex[p]: w for p, w in weights.items()}
            self._shunned = set(shunned)
            self._follow(self._converge())

    # --- timers (the agent's thread) ---

    def _schedule(self, due: float, what: str, fault_id: int) -> None:
        heapq.heappush(self._timers, (due, next(self._seq), what, fault_id))

    def _run(self) -> None:
        with self._lock:
            while not self._stop:
                now = time.monotonic()
                if self._timers and self._timers[0][0] <= now:
                    _, _, what, fid = heapq.heappop(self._timers)
                    try:
                        self._fire(what, next(f for f in self.faults if f.id == fid), now)
                    except Exception as e:  # noqa: BLE001 - a map gone with the fabric; keep the reason
                        self.errors.append(f"{what} of fault {fid}: {type(e).__name__}: {e}")
                    continue
                self._lock.wait(timeout=(self._timers[0][0] - now) if self._timers else None)

    def _fire(self, what: str, fault: Fault, now: float) -> None:
        if what == "notice-down":
            # BFD sees a port dead only once it has been dead for the whole detection time.
            detect = self._wall(fault.options["detection_s"])
            dead = [p for p in fault.ports if self._down.get(p) and now - self._since[p] >= detect * 0.999]
            for p in dead:
                self._noticed.setdefault(p, set()).add(fault.id)
            if dead:
                noticed = time.monotonic()
                members = self._converge()
                first = fault.converged_at is None
                if first:
                    fault.noticed_at, fault.converged_at = noticed, time.monotonic()
                self._follow(members)
                if first:
                    fault.routes_at = time.monotonic()
        elif what == "notice-up":
            changed = False
            for p in fault.ports:
                if not self._down.get(p) and fault.id in self._noticed.get(p, set()):
                    self._noticed[p].discard(fault.id)
                    changed = True
            members = self._converge() if changed else []
            if fault.restored_at is not None and fault.reconverged_at is None:
                fault.reconverged_at = time.monotonic()
            self._follow(members)
        elif what == "flap-up":
            if fault.restored_at is not None:
                return  # restored by hand while it flapped
            self._bring_up(fault, final=False)
            fault.flaps_done += 1
            if fault.flaps_done < int(fault.options.get("count", 1)):
                self._schedule(now + self._wall(fault.options["period_s"]) / 2, "flap-down", fault.id)
            else:
                fault.restored_at = now
        elif what == "flap-down" and fault.restored_at is None:
            self._take_down(fault, first=False)
            self._schedule(now + self._wall(fault.options["period_s"]) / 2, "flap-up", fault.id)
