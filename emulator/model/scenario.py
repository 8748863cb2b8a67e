"""The scenario file: a timeline of failures to apply to a running fabric while a workload runs.

Versioned YAML like the topology (emulator/model/spec.py), validated into frozen dataclasses;
every error names the file, the key path (``events[2].rate``) and what is wrong. Times are the
real fabric's (``50ms``) and are dilated with everything else when the scenario runs. Pure data:
reading the file is the only I/O; ``check_targets`` holds the events against a fabric's plan.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from emulator.errors import SpecError
from emulator.model import spec as spec_mod, units
from emulator.model.plan import FabricPlan, SWITCH_ROLES

FORMAT_VERSION = 1
# What each event does, and the options it takes (besides ``at`` and ``target``).
EVENTS = {
    "fiber-cut": (),  # a long-haul path down, both directions
    "ber": ("ber", "corruption", "loss"),  # bit errors or loss on a path
    "link-flap": ("count", "period"),  # down and up COUNT times, PERIOD per cycle
    "rate": ("rate",),  # a path or port degraded to RATE
    "latency-step": ("extra",),  # a path re-routed by EXTRA distance
    "switch-failure": (),  # every port of a switch down
    "pfc-storm": ("port", "priority", "for"),  # a NIC or port sending PAUSE without end
    "restore": (),  # undo every event on the target ("all": on every target)
}
# BFD's usual 3 x 50 ms: how long a dead link goes unnoticed before it is withdrawn.
DEFAULT_DETECTION_S = 0.150


@dataclass(frozen=True)
class Event:
    """One event of the timeline: at ``at_s`` (real seconds from the workload's start) do
    ``kind`` to ``target`` (``wan3``, a node, ``node:ifname`` or ``all``) with ``options``."""

    at_s: float
    kind: str
    target: str
    options: dict = field(default_factory=dict)
    where: str = ""  # its key path in the file, for errors found later

    def as_dict(self) -> dict:
        return {"at_s": self.at_s, "kind": self.kind, "target": self.target, "options": self.options}


@dataclass(frozen=True)
class Transfer:
    """The workload: one transfer, as ``run transfer`` does it."""

    srcs: tuple[str, ...]
    dst: str
    size: int  # bytes
    qps: int | None  # None: the topology's nic.qps_per_pair


@dataclass(frozen=True)
class Scenario:
    source: str
    name: str
    description: str
    topology: str | None  # a path, relative to the scenario's folder when not absolute
    seed: int
    detection_s: float  # a dead link is withdrawn from ECMP this long after it died (real)
    workload: Transfer
    events: tuple[Event, ...]

    def topology_path(self) -> Path | None:
        if self.topology is None:
            return None
        p = Path(self.topology)
        return p if p.is_absolute() else Path(self.source).parent / p

    def as_dict(self) -> dict:
        return {"source": self.source, "name": self.name, "description": self.description,
                "topology": self.topology, "seed": self.seed, "detection_s": self.detection_s,
                "workload": {"srcs": list(self.workload.srcs), "dst": self.workload.dst,
                             "size": self.workload.size, "qps": self.workload.qps},
                "events": [e.as_dict() for e in self.events]}


def _target(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ValueError(f"must be a path (wan0), a node, node:ifname or all, got {spec_mod._type_name(value)}")
    return str(value)


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"must be text, got {spec_mod._type_name(value)}")
    return value


def _hosts(value: Any) -> tuple[str, ...]:
    items = value if isinstance(value, list) else str(value).split(",")
    hosts = tuple(str(h).strip() for h in items if str(h).strip())
    if not hosts:
        raise ValueError("names no host")
    return hosts


def _duration(value: Any) -> float:
    return units.parse_duration(value)


def _extra(value: Any) -> float:
    metres = units.parse_distance(value)
    if metres <= 0:
        raise ValueError("must be a distance added to the path, above 0")
    return metres


_OPTION_PARSERS = {
    "ber": spec_mod._probability,
    "corruption": spec_mod._loss_rate,
    "loss": spec_mod._loss_rate,
    "count": spec_mod._int(1, 10_000),
    "period": spec_mod._positive(_duration, "period"),
    "rate": spec_mod._rate,
    "extra": _extra,
    "port": _text,
    "priority": spec_mod._int(0, 7),
    "for": spec_mod._positive(_duration, "for"),
}


def _event(r, item: Any, where: str) -> Event:
    m = r.mapping(item, where, ("at", "event", "target") + tuple(sorted({o for opts in EVENTS.values() for o in opts})))
    kind = r.get(m, where, "event", spec_mod._choice(tuple(EVENTS)))
    for key in m:
        if key not in ("at", "event", "target") and key not in EVENTS[kind]:
            allowed = ", ".join(EVENTS[kind]) or "none"
            raise r.fail(f"{where}.{key}", f"{kind} takes no {key}; its options: {allowed}")
    at = r.get(m, where, "at", spec_mod._non_negative(_duration, "at"))
    target = r.get(m, where, "target", _target)
    options = {k: r.get(m, where, k, _OPTION_PARSERS[k]) for k in EVENTS[kind] if k in m}
    if kind == "ber" and len(options) != 1:
        raise r.fail(where, "ber takes exactly one of ber (per bit), corruption or loss (per packet)")
    if kind == "rate" and "rate" not in options:
        raise r.fail(f"{where}.rate", "is required")
    if kind == "latency-step" and "extra" not in options:
        raise r.fail(f"{where}.extra", "is required")
    if kind == "link-flap":
        options.setdefault("count", 1)
        if "period" not in options:
            raise r.fail(f"{where}.period", "is required")
    if target == "all" and kind != "restore":
        raise r.fail(f"{where}.target", f"all: only restore takes every target; name one for {kind}")
    return Event(at, kind, target, options, where)


def parse(text: str, file: str = "<string>") -> Scenario:
    """Validate the YAML text of a scenario; ``file`` is used in error messages."""
    doc = spec_mod.load_yaml(text, file)
    r = spec_mod._Reader(file)
    top = r.mapping(doc, "", ("version", "name", "description", "topology", "seed", "control_plane", "workload",
                              "events"))
    version = r.get(top, "", "version", spec_mod._int(1))
    if version != FORMAT_VERSION:
        raise r.fail("version", f"format version {version} is not supported; this backplane reads {FORMAT_VERSION}")
    cp = r.mapping(top.get("control_plane"), "control_plane", ("detection",))
    detection = r.get(cp, "control_plane", "detection", spec_mod._non_negative(_duration, "detection"),
                      DEFAULT_DETECTION_S)
    w = r.mapping(top.get("workload"), "workload", ("transfer",))
    if "transfer" not in w:
        raise r.fail("workload.transfer", "is required (the workload the events act on)")
    t = r.mapping(w["transfer"], "workload.transfer", ("src", "dst", "size", "qps"))
    workload = Transfer(r.get(t, "workload.transfer", "src", _hosts),
                        r.get(t, "workload.transfer", "dst", _text),
                        r.get(t, "workload.transfer", "size", spec_mod._positive(units.parse_size, "size")),
                        r.get(t, "workload.transfer", "qps", spec_mod._int(1, 1024), None))
    items = top.get("events")
    if not isinstance(items, list) or not items:
        raise r.fail("events", "must be a list of at least one event")
    events = tuple(_event(r, item, f"events[{i}]") for i, item in enumerate(items))
    stem = Path(file).stem if file != "<string>" else "scenario"
    return Scenario(file, r.get(top, "", "name", _text, stem), r.get(top, "", "description", _text, ""),
                    r.get(top, "", "topology", _text, None), r.get(top, "", "seed", spec_mod._int(0), 1), detection,
                    workload, tuple(sorted(events, key=lambda e: e.at_s)))


def load(path: str | Path) -> Scenario:
    return parse(spec_mod.read_text(path), str(path))


def targets(plan: FabricPlan, kind: str) -> list[str]:
    """What an event of ``kind`` can act on in ``plan``, as the scenario names them."""
    paths = [n.name for n in plan.nodes if n.role == "fiber"]
    switches = [n.name for n in plan.nodes if n.role in SWITCH_ROLES]
    ports = [f"{p.node}:{p.ifname}" for p in plan.ports() if plan.node(p.node).role in SWITCH_ROLES]
    if kind in ("fiber-cut", "ber", "latency-step"):
        return paths
    if kind in ("link-flap", "rate"):
        return paths + ports
    if kind == "switch-failure":
        return switches
    if kind == "pfc-storm":
        return [n.name for n in plan.nodes if n.role in ("host",) + SWITCH_ROLES]
    return ["all"] + paths + switches + ports


def check_targets(scn: Scenario, plan: FabricPlan) -> None:
    """Every event's target exists in ``plan`` and takes that event; an error names them."""
    for e in scn.events:
        known = targets(plan, e.kind)
        if e.target not in known:
            shown = ", ".join(known[:24]) + (f" and {len(known) - 24} more" if len(known) > 24 else "")
            raise SpecError(scn.source, f"{e.where}.target",
                            f"{e.target!r} is not a target of {e.kind} in fabric {plan.name!r}: {shown or 'none'}")
    for host in (*scn.workload.srcs, scn.workload.dst):
        try:
            role = plan.node(host).role
        except KeyError:
            role = None
        if role != "host":
            hosts = [n.name for n in plan.nodes if n.role == "host"]
            raise SpecError(scn.source, "workload.transfer", f"{host!r} is not a host of fabric {plan.name!r}: "
                                                             f"{', '.join(hosts)}")
