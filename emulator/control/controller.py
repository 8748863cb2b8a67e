"""The controller: the one process that owns a running fabric.

``backplane up`` starts it detached; it builds the fabric, reports success or a typed error on
a pipe, then serves JSON requests on a Unix socket until ``down`` or a signal, and tears the
fabric down on the way out. Its node shells die with it; what a crash leaves behind, ``clean``
finds by the fabric's prefix.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import time
import traceback

from emulator import errors
from emulator.bpf import install
from emulator.control import state
from emulator.fabric.build import Fabric
from emulator.faults.adaptive import AdaptiveAgent
from emulator.faults import routing
from emulator.faults.agent import FaultAgent, KINDS as FAULT_KINDS
from emulator.model import plan as plan_mod, spec
from emulator.model.scenario import DEFAULT_DETECTION_S
from emulator.fabric import queues
from emulator.model.plan import Port, SWITCH_ROLES
from emulator.telemetry import describe, ports as telemetry
from emulator.telemetry.records import PathReading, PortReading, PortSample

PROTOCOL = 1
MAX_REQUEST = 1 << 16


class _Stop(BaseException):
    """Raised in the main thread by SIGTERM/SIGINT: tear down and leave."""


def _on_signal(signum, frame):  # noqa: ARG001
    raise _Stop()


def _error_payload(e: BaseException) -> dict:
    if isinstance(e, errors.BackplaneError):
        return {"ok": False, "error": str(e), "type": type(e).__name__, "exit_code": e.exit_code}
    return {"ok": False, "error": f"{type(e).__name__}: {e}", "type": "FabricError",
            "exit_code": errors.FabricError.exit_code}


class Controller:
    def __init__(self, fabric: Fabric, topology_text: str = "", topology_path: str = "",
                 dilation: str | None = None, scale: float | None = None) -> None:
        self.fabric = fabric
        self.plan = fabric.plan
        self.topology_text, self.topology_path, self.dilation = topology_text, topology_path, dilation
        self.scale = scale
        self.started_at = time.time()
        self.guard = None  # telemetry.FidelityGuard, from the first stats request on
        self.hash_mode = self.plan.spec.ecmp.hash  # set_hash changes it while the fabric runs
        self._switch_ports = None  # the ports "sample" reads, listed once
        self._wan_ports = None  # (border port, path, the fiber's port beyond it), listed once
        self._full_groups: dict = {}  # the ECMP groups with nothing down
        self._marks: dict[int, object] = {}  # fidelity marks a run is judged against later
        self._fault_agent = None  # faults.agent.FaultAgent, from the first fault on
        self._adaptive = None  # faults.adaptive.AdaptiveAgent, with ecmp.adaptive from the start
        if self.plan.spec.ecmp.adaptive != "off" and fabric.datapath is not None:
            self._adaptive = AdaptiveAgent(self._fault_agent_now(), fabric.datapath, self.plan,
                                           self._fiber_drops if fabric.wan_delay else None)

    def _guard(self) -> telemetry.FidelityGuard:
        if self.guard is None:
            self.guard = telemetry.FidelityGuard(self.fabric)
        return self.guard

    def _datapath(self):
        if self.fabric.datapath is None:
            raise errors.BackplaneError(f"fabric {self.plan.name!r} runs the kernel datapath (ecmp.datapath: kernel); "
                                        "this needs the eBPF one")
        return self.fabric.datapath

    def handle(self, request: dict) -> tuple[dict, bool]:
        """Answer one request; the bool says whether to stop serving afterwards."""
        op = request.get("op")
        handler = self.HANDLERS.get(op) if isinstance(op, str) else None
        if handler is None:
            raise errors.BackplaneError(f"unknown request {op!r}: this controller answers "
                                        f"{', '.join(sorted(self.HANDLERS))}")
        return handler(self, request), op == "down"

    def _ping(self, request: dict) -> dict:
        return {"ok": True, "protocol": PROTOCOL, "name": self.plan.name, "pid": os.getpid()}

    def _status(self, request: dict) -> dict:
        body = describe.fabric(self.fabric, measure_rtt=bool(request.get("rtt", True)))
        body.update(controller_pid=os.getpid(), up_since=self.started_at)
        return {"ok": True, "status": body}

    def _plan(self, request: dict) -> dict:
        """What the fabric was built from, so a client builds the very same plan: the topology
        as it was read at ``up`` (the file may have changed since), and the dilation and scale."""
        return {"ok": True, "topology": self.topology_text, "source": self.topology_path,
                "dilation": self.dilation, "scale": self.scale, "name": self.plan.name, "wan_delay": self.fabric.wan_delay}

    def _fidelity(self, request: dict) -> dict:
        # A run's fidelity: {"op": "fidelity"} marks its start and answers the mark's id;
        # {"op": "fidelity", "since": id} judges everything since (machine and dequeue pacing).
        guard = self._guard()
        if request.get("since") is None:
            key = max(self._marks, default=0) + 1
            self._marks[key] = guard.mark()
            return {"ok": True, "mark": key}
        mark = self._marks.pop(int(request["since"]), None)
        if mark is None:
            raise errors.BackplaneError(f"no fidelity mark {request['since']!r}")
        return {"ok": True, "fidelity": guard.since(mark)}

    def _stats(self, request: dict) -> dict:
        guard = self._guard()
        ports = [telemetry.port_stats(self.fabric, p) for p in self.plan.ports()]
        body = {"name": self.plan.name, "datapath": self.plan.spec.ecmp.datapath,
                "datapath_build": self.fabric.datapath.build if self.fabric.datapath is not None else None,
                "hash": self.hash_mode if self.fabric.datapath is not None else "kernel five-tuple",
                "scale": self.plan.spec.scale, "time_model": self.plan.spec.time.as_dict(),
                "at": time.time(), "ports": ports, "fidelity": guard.check()}
        if self._adaptive is not None:
            body["adaptive"] = self._adaptive.summary()
        if self.fabric.datapath is not None:
            lt = self.fabric.datapath.load_times
            body["load_times"] = {"compile_s": lt.compile_s, **{f"load_{k}_s": v for k, v in lt.load_s.items()}}
        return {"ok": True, "stats": body}

    def _queue(self, request: dict) -> dict:
        # One port's true depth from the maps, bracketing the qdisc's own backlog, read back
        # to back so the two can be compared while traffic flows.
        dp = self._datapath()
        port = self.plan.port(str(request.get("node")), str(request.get("ifname")))
        ipr = self.fabric.nodes[port.node].ipr
        before = dp.queue(port.ifindex)["depth"]
        backlog = queues.counters(ipr, port.ifindex)["backlog_bytes"]
        after = dp.queue(port.ifindex)["depth"]
        return {"ok": True, "depth_before": before, "backlog": backlog, "depth_after": after}

    def _pacing(self, request: dict) -> dict:
        # How one port's egress queue released frames while backlogged (Mininet-HiFi's check),
        # counted since the maps were made: callers difference two readings.
        port = self.plan.port(str(request.get("node")), str(request.get("ifname")))
        return {"ok": True, "pacing": self._datapath().pacing(port.ifindex)}

    def _sample(self, request: dict) -> dict:
        # Every switch port's queue and marks now, for time series taken while traffic runs.
        dp = self._datapath()
        if self._switch_ports is None:
            self._switch_ports = [p for p in self.plan.ports() if self.plan.node(p.node).role in SWITCH_ROLES]
        rows = []
        lossless = self.plan.spec.pfc.lossless
        for p in self._switch_ports:
            q = dp.queue(p.ifindex)
            c = dp.counters(p.ifindex)
            pfc = {}
            if dp.pfc is not None and self.plan.pfc_port(p):
                counts = [dp.pfc_counters(p.ifindex, prio) for prio in lossless]
                pfc = {"paused": sum(1 << prio for prio in lossless if dp.pfc.shut(p.ifindex, prio)),
                       "pauses_sent": sum(r["tx_pause"] for r in counts),
                       "lossless_drops": sum(r["drop_headroom"] + r["wd_tx_drop"] + r["wd_rx_drop"] for r in counts)}
            rows.append(PortReading(f"{p.node}:{p.ifname}", q["depth"], q["deq_bytes"], c["ecn_marks"],
                                    c["drop_buffer"], down_drops=c["drop_link_down"], **pfc))
        paths = self._path_readings() if request.get("paths") else []  # scenario runs record them
        return {"ok": True, **PortSample(time.monotonic(), rows, paths).as_dict()}

    def _path_readings(self) -> list[PathReading]:
        # Each border port onto a long-haul path: its ECMP share now, and the fiber's count (its
        # namespace's /proc net/dev, both directions at once).
        if self._wan_ports is None:
            full = routing.ecmp_groups(self.plan, set())
            self._wan_ports = []
            for link in self.plan.links:
                if link.kind != "wan":
                    continue
                for end in (link.a, link.b):
                    if self.plan.node(end.node).role in SWITCH_ROLES:
                        keys = routing.serving(full, end.ifindex, self.plan.node(end.node).uid)
                        self._wan_ports.append((end, link.path, self._beyond(end), keys))
            self._full_groups = full
        now = self._fault_agent.groups() if self._fault_agent is not None else self._full_groups
        fibers = {out.node for _, _, out, _ in self._wan_ports}
        counts = {node: telemetry.netdev_packets(self.fabric.nodes[node].pid) for node in fibers}
        return [PathReading(f"{b.node}:{b.ifname}", path, routing.share(now, b.ifindex, keys),
                            counts[out.node][out.ifname]["tx_packets"])
                for b, path, out, keys in self._wan_ports]

    def _agent(self):
        dp = self._datapath()
        if dp.pfc is None:
            raise errors.UsageError(f"fabric {self.plan.name!r} does not run PFC (pfc.enabled: false)")
        return dp

    def _pfc(self, request: dict) -> dict:
        # The PFC agent's work, its measured reaction, the watchdog's storms and injections.
        agent = self._agent().pfc
        body = agent.summary()
        if request.get("samples"):
            body["reactions_s"] = [ns / 1e9 for ns in agent.reactions_ns]
        return {"ok": True, "pfc": body}

    def _pfcwd(self, request: dict) -> dict:
        # SONiC's pfcwd verbs: start (with changes), stop, config, stats.
        dp = self._agent()
        cmd = request.get("cmd")
        if cmd == "start":
            action = request.get("action")
            if action is not None and action not in spec.PFC_WATCHDOG_ACTIONS:
                raise errors.UsageError(f"action {action!r}: use one of {', '.join(spec.PFC_WATCHDOG_ACTIONS)}")
            changes = {k: request.get(k) for k in ("action", "detection_s", "restoration_s", "poll_s")}
            for key in ("detection_s", "restoration_s", "poll_s"):
                if changes[key] is not None and not float(changes[key]) > 0:
                    raise errors.UsageError(f"{key}: must be a positive time")
            return {"ok": True, "config": dp.pfc.set_watchdog(enabled=True, **changes)}
        if cmd == "stop":
            return {"ok": True, "config": dp.pfc.set_watchdog(enabled=False)}
        if cmd == "config":
            return {"ok": True, "config": dp.pfc.watchdog.as_dict(), "time_model": self.plan.spec.time.as_dict()}
        if cmd == "stats":
            return {"ok": True, "stats": dp.pfc.watchdog_stats(dp.pfc_counters),
                    "storms": [s.as_dict() for s in dp.pfc.storms]}
        raise errors.UsageError(f"pfcwd {cmd!r}: use start, stop, config or stats")

    def _beyond(self, border: Port) -> Port:
        # The fiber's port that carries on what ``border`` sends onto it (towards the far border).
        into = self.plan.peer(border)
        return next(p for p in self.plan.ports(into.node) if p.ifname != into.ifname)

    def _fiber_drops(self, border_port: str) -> int:
        # What the fiber's delay line dropped of what this border port sent onto it (netem loss).
        node, _, ifname = border_port.partition(":")
        out = self._beyond(self.plan.port(node, ifname))
        return queues.counters(self.fabric.nodes[out.node].ipr, out.ifindex)["drops"]

    def _fault_agent_now(self):
        if self._fault_agent is None:
            self._fault_agent = FaultAgent(self._datapath(), self.plan, DEFAULT_DETECTION_S,
                                           ipr_of=lambda node: self.fabric.nodes[node].ipr,
                                           delay_lines=self.fabric.wan_delay)
        return self._fault_agent

    def _faults(self, request: dict) -> dict:
        # The faults applied so far, each with its timeline.
        tm = self.plan.spec.time.as_dict()
        if request.get("prepare"):
            self._fault_agent_now()  # its tables computed now, so the first fault is not late by them
        if self._fault_agent is None:
            return {"ok": True, "faults": [], "errors": [], "down": [], "withdrawn": [], "now": time.monotonic(),
                    "time_model": tm}
        return {"ok": True, **self._fault_agent.summary(), "time_model": tm}

    def _inject(self, request: dict) -> dict:
        # Faults on a running fabric: ports down (a cut fiber, a flapping link, a failed switch)
        # and their restoration, or a PFC storm from a port (a stuck NIC).
        kind = request.get("kind")
        if kind in FAULT_KINDS:
            detection = request.get("detection_s")
            if detection is not None and float(detection) < 0:
                raise errors.UsageError("detection: must be a time of 0 or more")
            options = {k: request[k] for k in ("count", "period_s", "rate_bps", "ber", "corruption", "loss", "extra_m")
                       if request.get(k) is not None}
            return {"ok": True, "fault": self._fault_agent_now().apply(kind, str(request.get("target")), options, detection),
                    "now": time.monotonic()}
        dp = self._agent()
        if kind != "pfc-storm":
            raise errors.UsageError(f"inject {kind!r}: use one of pfc-storm, {', '.join(FAULT_KINDS)}")
        node = str(request.get("node"))
        try:
            role = self.plan.node(node).role
        except KeyError:
            raise errors.UsageError(f"no node {node!r} in fabric {self.plan.name!r}") from None
        ifname = request.get("ifname")
        ports = list(self.plan.ports(node))
        if ifname is None:
            if len(ports) != 1:
                raise errors.UsageError(f"{node} ({role}) has {len(ports)} ports: name one with --port "
                                        f"({', '.join(p.ifname for p in ports)})")
            port = ports[0]
        else:
            port = next((p for p in ports if p.ifname == ifname), None)
            if port is None:
                raise errors.UsageError(f"{node} has no port {ifname!r}")
        if not self.plan.pfc_port(port):
            raise errors.UsageError(f"{node}:{port.ifname} is on a long-haul path: PFC does not run there")
        prio = int(request.get("priority", self.plan.spec.pfc.priority))
        if not 0 <= prio < 8:
            raise errors.UsageError(f"priority {prio}: use 0..7")
        if request.get("stop"):
            return {"ok": True, "storm": dp.pfc.stop_storm(port.ifindex, prio)}
        duration = request.get("for_s")
        return {"ok": True, "storm": dp.pfc.inject_storm(port.ifindex, prio, float(duration) if duration else None),
                "now": time.monotonic()}

    def _set_hash(self, request: dict) -> dict:
        mode = request.get("hash")
        dp = self._datapath()
        if mode not in spec.HASH_MODES:
            raise errors.BackplaneError(f"hash mode {mode!r}: use one of {', '.join(spec.HASH_MODES)}")
        dp.set_hash(mode)
        self.hash_mode = mode
        return {"ok": True, "hash": mode}

    def _down(self, request: dict) -> dict:
        started = time.monotonic()
        if self._adaptive is not None:
            self._adaptive.close()
        if self._fault_agent is not None:
            self._fault_agent.close()
        self.fabric.stop()
        return {"ok": True, "down_seconds": time.monotonic() - started}

    HANDLERS = {"ping": _ping, "status": _status, "plan": _plan, "fidelity": _fidelity, "stats": _stats,
                "queue": _queue, "pacing": _pacing, "sample": _sample, "pfc": _pfc, "pfcwd": _pfcwd,
                "inject": _inject, "faults": _faults, "set_hash": _set_hash, "down": _down}

    def serve(self, listener: socket.socket) -> None:
        while True:
            conn, _ = listener.accept()
            with conn:
                stop = False
                try:
                    conn.settimeout(30)
                    data = b""
                    while not data.endswith(b"\n") and len(data) < MAX_REQUEST:
                        chunk = conn.recv(4096)
                        if not chunk:
                            break
                        data += chunk
                    request = json.loads(data or b"{}")
                    if not isinstance(request, dict):
                        raise ValueError("a request is a JSON object")
                    reply, stop = self.handle(request)
                except _Stop:
                    raise
                except Exception as e:  # noqa: BLE001 - a bad request must not kill the fabric
                    reply = _error_payload(e)
                try:
                    conn.sendall(json.dumps(reply).encode() + b"\n")
                except OSError:
                    pass
                if stop:
                    return


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m emulator.control.controller")
    ap.add_argument("--name", required=True)
    ap.add_argument("--topology", required=True)
    ap.add_argument("--no-wan-delay", action="store_true")
    ap.add_argument("--dilation", default=None, help="replaces the topology's (a preset's name or a number)")
    ap.add_argument("--scale", type=float, default=None, help="replaces the topology's")
    ap.add_argument("--ready-fd", type=int, required=True)
    a = ap.parse_args(argv)
    ready = os.fdopen(a.ready_fd, "w")
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGHUP, _on_signal)
    fabric = None
    listener = None
    failed = False
    try:
        topology = os.path.abspath(a.topology)
        text = spec.read_text(topology)
        fabric_plan = plan_mod.build(spec.from_text(text, topology, spec.parse_dilation(a.dilation), a.scale),
                                     a.name)
        state.write_record(a.name, topology, not a.no_wan_delay, a.dilation, a.scale)
        fabric = Fabric(fabric_plan, wan_delay=not a.no_wan_delay, datapath_builder=install)
        fabric.start()
        path = state.socket_path(a.name)
        if path.exists():
            path.unlink()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(path))
        os.chmod(path, 0o600)
        listener.listen(8)
        ready.write(json.dumps({"ok": True, "pid": os.getpid(), "up_seconds": fabric.up_seconds,
                                "nodes": len(fabric_plan.nodes), "links": len(fabric_plan.links),
                                "wan_delay": fabric.wan_delay,
                                "datapath_build": fabric.datapath.build if fabric.datapath else None}) + "\n")
        ready.close()
        ready = None
        Controller(fabric, text, topology, a.dilation, a.scale).serve(listener)
        return 0
    except _Stop:
        return 0
    except BaseException as e:  # noqa: BLE001 - report every failure to `up`, then clean up
        failed = True
        traceback.print_exc()
        if ready is not None:
            try:
                ready.write(json.dumps(_error_payload(e)) + "\n")
            except OSError:
                pass
        return 1
    finally:
        # The teardown runs to the end: a second signal must not leave half a fabric behind.
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        if listener is not None:
            listener.close()
        if fabric is not None:
            try:
                fabric.stop()
            except Exception:  # noqa: BLE001
                traceback.print_exc()
        if ready is not None:
            try:
                ready.close()
            except OSError:
                pass
        state.remove(a.name, keep_log=failed)


if __name__ == "__main__":
    sys.exit(main())
