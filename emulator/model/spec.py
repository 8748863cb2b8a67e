"""The topology file: a versioned YAML format parsed into frozen dataclasses.

Pure data: reading the file is the only I/O. Every error names the file, the key path
(``datacenters[1].hosts_per_leaf``) and what is wrong. Rates, times and byte sizes are written
as the real fabric has them (``400Gbps``, ``15ms``, ``16MB``); ``scale`` and ``dilation`` turn
them into what the emulation runs (emulator/model/timemodel.py): rates x scale, times x dilation,
bytes x scale*dilation.
"""
from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import yaml

from emulator.errors import SpecError
from emulator.model import units
from emulator.model.timemodel import PRESETS as DILATION_PRESETS, TimeModel
from emulator.nic import dcqcn as dcqcn_mod, rc as rc_mod

FORMAT_VERSION = 1
# IPv4 20 + UDP 8 + BTH 12 + RETH 16 + 4096 payload + ICRC 4: the largest RoCEv2 packet we send.
ROCE_MAX_PACKET = 20 + 8 + 12 + 16 + 4096 + 4
ETH_HEADER = 14
# Below this an emulated port serialises a 4 KB frame in more than 30 ms: no longer a fabric.
MIN_EMULATED_RATE = 1_000_000
# HTB and TBF carry rates as 32-bit bytes per second.
MAX_EMULATED_RATE = 34_000_000_000
# Queue limits (bfifo, the datapath's buffer) are 32-bit byte counts; leave room for headroom.
MAX_EMULATED_BUFFER = 4_000_000_000
# netem carries its delay as 32-bit ticks of 64 ns (274 s); keep clear of the wrap.
MAX_NETEM_DELAY_S = 200.0
# The switches' ECMP hash: the baseline five-tuple, Meta's E-ECMP on the destination QP, per-packet
# spraying on QP and PSN, or the UDP source port as an entropy value (bp_consts.h numbers them
# in this order; tests/datapath checks it).
HASH_MODES = ("five-tuple", "qpn", "qpn-psn", "ev")
# ebpf: the switches forward RoCEv2 in eBPF (ECMP by ecmp.hash, true queue depth, WRED ECN);
# kernel: plain Linux routers with kernel ECMP (five-tuple), the baseline it replaces.
DATAPATHS = ("ebpf", "kernel")
TRANSPORTS = rc_mod.MODES  # the soft-NIC's loss recovery
WINDOWS = ("bdp", "none")
DCQCN_PROFILES = dcqcn_mod.PROFILE_NAMES
PFC_WATCHDOG_ACTIONS = ("drop", "forward", "alert")
ADAPTIVE_MODES = ("off", "queue", "health")
# A flowlet gap beyond the paths' skew: what queues can add to one path against another.
FLOWLET_QUEUE_S = 50e-6
DEADLOCK_AVOIDANCE = ("none", "tagger")
# Priorities the QoS policy gives away: lossy 0 and the CNPs' 6 (emulator/bpf/datapath.py).
RESERVED_PRIORITIES = (0, 6)
SHAPERS = ("htb", "tbf")
_NAME = re.compile(r"^[a-z][a-z0-9]{0,7}$")
_REQUIRED = object()


@dataclass(frozen=True)
class DataCenter:
    name: str
    spines: int
    leaves: int
    hosts_per_leaf: int
    borders: int


@dataclass(frozen=True)
class WanPath:
    """One long-haul path: a fiber between the two DCs' borders."""

    index: int
    distance_m: float
    rate_bps: int  # real rate; the emulation runs rate_bps * scale
    loss: float  # per-packet drop probability
    corruption: float  # per-packet corruption probability (from ``ber`` if that was given)
    ber: float  # bit error rate as written, 0 when ``corruption`` was given directly

    @property
    def delay_s(self) -> float:
        """One-way propagation delay."""
        return units.fiber_delay(self.distance_m)


@dataclass(frozen=True)
class LinkRates:
    host: int  # host <-> leaf, real bits per second
    fabric: int  # leaf <-> spine
    border: int  # spine <-> border


@dataclass(frozen=True)
class Buffers:
    host: int  # real bytes of egress buffer on a host NIC port
    switch: int  # on a leaf or spine port
    border: int  # on a border port (deep-buffer WAN routers)


@dataclass(frozen=True)
class Addressing:
    hosts: ipaddress.IPv4Network  # carved into one subnet per leaf
    host_prefix: int
    links: ipaddress.IPv4Network  # carved into /31 point-to-point subnets


@dataclass(frozen=True)
class Latency:
    """What a packet takes inside a DC besides queueing, real: the cables and the switches'
    forwarding (cut-through ASICs). Queueing is emulated by the real queues; this is the rest."""

    cable_m: float = 20.0  # a typical cable in a hall: 100 ns of fiber
    switch_s: float = 500e-9  # one switch traversal

    def one_way_s(self, cables: int, switches: int) -> float:
        return cables * units.fiber_delay(self.cable_m) + switches * self.switch_s


@dataclass(frozen=True)
class Ecmp:
    hash: str = "five-tuple"
    datapath: str = "ebpf"
    # Adaptive routing on the borders' long-haul groups: off (static hash), queue (weights
    # fall with a path's queue), health (a path that loses packets is left, then retried).
    adaptive: str = "off"
    flowlet_gap_s: float | None = None  # real; None: the paths' skew + FLOWLET_QUEUE_S
    adaptive_interval_s: float = 100e-6  # real: how often the agent reads the paths
    health_threshold: float = 1e-3  # health: the share of a path's packets lost that leaves it


@dataclass(frozen=True)
class Ecn:
    kmin: int = 5_000  # real bytes; DCQCN paper's values
    kmax: int = 200_000
    pmax: float = 0.01
    # Where each threshold came from: "ecn" (the topology's own), "profile <name>" (the NIC's
    # DCQCN profile names switch thresholds) or "default"; reports say which.
    source: tuple[str, str, str] = ("default", "default", "default")


@dataclass(frozen=True)
class PfcWatchdog:
    detection_time: float = 0.2  # SONiC pfcwd defaults, real seconds (dilated like every time)
    restoration_time: float = 0.2
    action: str = "drop"
    enabled: bool = True  # SONiC starts it on every lossless queue by default
    poll_interval: float = 0.2  # how often it looks (SONiC: 200 ms): detection may take this much longer


@dataclass(frozen=True)
class Pfc:
    enabled: bool = False
    priority: int = 3
    xoff: int = 1_000_000  # real bytes of ingress occupancy that send PAUSE
    xon: int = 500_000
    watchdog: PfcWatchdog = field(default_factory=PfcWatchdog)
    # Real bytes each port's ingress reserves beyond XOFF for what arrives while its PAUSE takes
    # effect; None: computed (emulator/model/pfc.py). A figure below the computed need is refused.
    headroom: int | None = None
    # Lossless across the long-haul paths too: refused with its figure (rate x RTT of headroom);
    # by default the WAN-facing border ports are lossy, deep-buffered, as in production.
    long_haul: bool = False
    # "tagger": a lossless packet that bounces (comes down from a higher tier, then goes up again)
    # moves to tagger_priority, also lossless, so no cyclic buffer dependency can form (Tagger,
    # CoNEXT 2017); "none": it stays where it is.
    deadlock_avoidance: str = "none"
    tagger_priority: int = 4

    @property
    def lossless(self) -> tuple[int, ...]:
        return (self.priority, self.tagger_priority) if self.deadlock_avoidance == "tagger" else (self.priority,)


@dataclass(frozen=True)
class Nic:
    transport: str = "selective"
    dcqcn: str = "paper"
    qps_per_pair: int = 1
    # In flight per NIC: "bdp" (IRN's BDP flow control: one bandwidth-delay product, shared by
    # the NIC's QPs) or "none" (as a ConnectX without IRN: a QP sends at its rate, whatever is
    # unacknowledged, up to the responder's window).
    window: str = "bdp"
    # The profile's fields the topology overrides, as (Profile field, value) pairs, real units.
    dcqcn_overrides: tuple[tuple[str, Any], ...] = ()

    def dcqcn_profile(self, line_rate_bps: float) -> dcqcn_mod.Profile:
        """The DCQCN profile for a NIC of ``line_rate_bps`` (real, unscaled), overrides applied."""
        return dcqcn_mod.profile(self.dcqcn, line_rate_bps, dict(self.dcqcn_overrides))


@dataclass(frozen=True)
class FabricSpec:
    source: str
    version: int
    scale: float
    mtu: int
    dilation: float
    dilation_preset: str | None  # "realtime" | "faithful", or None when a number was given
    shaper: str
    addressing: Addressing
    links: LinkRates
    buffers: Buffers
    datacenters: tuple[DataCenter, ...]
    wan_paths: tuple[WanPath, ...]
    ecmp: Ecmp
    ecn: Ecn
    pfc: Pfc
    nic: Nic
    latency: Latency = field(default_factory=Latency)
    routes: tuple["RouteOverride", ...] = ()

    @property
    def time(self) -> TimeModel:
        return TimeModel(self.scale, self.dilation, self.dilation_preset)

    def flowlet_gap(self) -> float:
        """Adaptive routing's flowlet gap (real s): given, or the long-haul paths' skew (the
        longest one-way delay minus the shortest) plus what queues may add."""
        if self.ecmp.flowlet_gap_s is not None:
            return self.ecmp.flowlet_gap_s
        delays = [p.delay_s for p in self.wan_paths] or [0.0]
        return max(delays) - min(delays) + FLOWLET_QUEUE_S

    def emulated_rate(self, real_bps: int) -> int:
        return self.time.rate(real_bps)

    def emulated_size(self, real_bytes: int) -> int:
        """Buffers, thresholds, byte counters: x scale*dilation."""
        return self.time.size(real_bytes)

    def emulated_time(self, real_s: float) -> float:
        return self.time.time(real_s)

    def emulated_ecn(self) -> tuple[int, int, float]:
        """(Kmin, Kmax, Pmax) as the switches mark: bytes scaled."""
        return self.emulated_size(self.ecn.kmin), self.emulated_size(self.ecn.kmax), self.ecn.pmax

    def intra_dc_one_way_s(self) -> float:
        """Real one-way latency host to host across a spine: 4 cables, leaf, spine and leaf
        (within one leaf: 2 cables and 1 switch)."""
        crosses_spine = any(dc.leaves > 1 for dc in self.datacenters)
        return self.latency.one_way_s(4, 3) if crosses_spine else self.latency.one_way_s(2, 1)

    @property
    def cross_dc(self) -> bool:
        return len(self.datacenters) == 2


# --- field parsers: each takes the raw YAML value and raises ValueError with what is wrong ---


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _int(minimum: int, maximum: int | None = None) -> Callable[[Any], int]:
    def parse(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"must be an integer, got {_type_name(value)} {value!r}")
        if value < minimum:
            raise ValueError(f"must be at least {minimum}, got {value}")
        if maximum is not None and value > maximum:
            raise ValueError(f"must be at most {maximum}, got {value}")
        return value

    return parse


def _positive(parse: Callable[[Any], Any], what: str) -> Callable[[Any], Any]:
    def wrapped(value: Any) -> Any:
        result = parse(value)
        if result <= 0:
            raise ValueError(f"{what} must be positive, got {value!r}")
        return result

    return wrapped


def _non_negative(parse: Callable[[Any], Any], what: str) -> Callable[[Any], Any]:
    def wrapped(value: Any) -> Any:
        result = parse(value)
        if result < 0:
            raise ValueError(f"{what} must not be negative, got {value!r}")
        return result

    return wrapped


def _choice(options: tuple[str, ...]) -> Callable[[Any], str]:
    def parse(value: Any) -> str:
        if value not in options:
            raise ValueError(f"must be one of {', '.join(options)}; got {value!r}")
        return value

    return parse


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"must be true or false, got {_type_name(value)} {value!r}")
    return value


def _name(value: Any) -> str:
    if not isinstance(value, str) or not _NAME.match(value):
        raise ValueError(
            f"must be 1-8 lower-case letters or digits starting with a letter, got {value!r}"
        )
    return value


def _scale(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"must be a number such as 0.001, got {_type_name(value)} {value!r}")
    if not 0 < value <= 1:
        raise ValueError(f"must be in (0, 1], got {value}")
    return float(value)


def _dilation(value: Any) -> float | str:
    if isinstance(value, str) and value in DILATION_PRESETS:
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"must be {' or '.join(DILATION_PRESETS)}, or a number such as 10, got {value!r}")
    if not value > 0:
        raise ValueError(f"must be positive, got {value}")
    return float(value)


def time_model(scale: float, dilation: float | str, file: str, where: str = "dilation") -> TimeModel:
    """The time model of ``scale`` and ``dilation`` (a preset's name or a number), or a SpecError
    that says why that dilation cannot run at that scale."""
    try:
        return TimeModel.of(scale, _dilation(dilation))
    except ValueError as e:
        raise SpecError(file, where, str(e)) from None


def _network(value: Any) -> ipaddress.IPv4Network:
    if not isinstance(value, str):
        raise ValueError(f"must be an IPv4 prefix such as '198.18.0.0/16', got {value!r}")
    try:
        return ipaddress.IPv4Network(value, strict=True)
    except ValueError as e:
        raise ValueError(f"is not an IPv4 prefix: {e}") from None


_rate = _positive(units.parse_rate, "rate")
_size = _positive(units.parse_size, "size")
_distance = _positive(units.parse_distance, "distance")
_duration = _positive(units.parse_duration, "duration")
_probability = _non_negative(units.parse_probability, "probability")


def _loss_rate(value: Any) -> float:
    """A path's loss or corruption: a probability below 1. A bare 1 is almost always meant as
    1%, and a path that drops everything is a cut, not a loss rate."""
    p = _probability(value)
    if p >= 1.0:
        raise ValueError(f"{value!r} would drop every packet; for one percent write '1%' or 0.01 "
                         "(a path that is down is a failure to inject, not a loss rate)")
    return p


def _fraction(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
        raise ValueError(f"must be a number in (0, 1) such as 0.00390625, got {value!r}")
    return float(value)


class _Reader:
    """Walks the YAML tree keeping the file name, so every error can say where it is."""

    def __init__(self, file: str) -> None:
        self.file = file

    def fail(self, path: str, message: str) -> SpecError:
        return SpecError(self.file, path, message)

    def mapping(self, value: Any, path: str, allowed: tuple[str, ...]) -> dict:
        if value is None:
            value = {}
        if not isinstance(value, dict):
            raise self.fail(path or "(top level)", f"must be a mapping, got {_type_name(value)}")
        for key in value:
            if key not in allowed:
                raise self.fail(
                    _join(path, str(key)), f"unknown key; expected one of: {', '.join(allowed)}"
                )
        return value

    def get(self, m: dict, path: str, key: str, parse: Callable[[Any], Any], default: Any = _REQUIRED) -> Any:
        where = _join(path, key)
        if key not in m:
            if default is _REQUIRED:
                raise self.fail(where, "is required")
            return default
        try:
            return parse(m[key])
        except ValueError as e:
            raise self.fail(where, str(e)) from None


def _duplicate_key(node: yaml.Node | None, path: str = "") -> tuple[str, int, int] | None:
    """The first mapping key given twice: (its key path, its first line, its second line)."""
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key, value in node.value:
            name = key.value if isinstance(key, yaml.ScalarNode) else None
            if name is not None:
                if name in seen:
                    return _join(path, name), seen[name], key.start_mark.line + 1
                seen[name] = key.start_mark.line + 1
            found = _duplicate_key(value, _join(path, str(name)))
            if found:
                return found
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            found = _duplicate_key(item, f"{path}[{i}]")
            if found:
                return found
    return None


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def read_text(path: str | Path) -> str:
    """A topology file's text, or a SpecError saying why it cannot be had."""
    file = str(path)
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise SpecError(file, "", f"cannot read: {e.strerror}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SpecError(file, "", f"not a text file: byte {data[e.start]:#04x} at offset {e.start} is not "
                                  "UTF-8 (a topology is YAML text)") from None


def load(path: str | Path, dilation: float | str | None = None, scale: float | None = None) -> FabricSpec:
    """Read and validate a topology file; ``dilation`` and ``scale`` (``up --dilation``,
    ``up --scale``) replace the file's."""
    return from_text(read_text(path), str(path), dilation, scale)


def from_text(text: str, file: str, dilation: float | str | None = None, scale: float | None = None) -> FabricSpec:
    """Validate a topology's text (read from ``file``); ``dilation`` and ``scale`` replace the file's."""
    out = parse(text, file)
    return out if dilation is None and scale is None else with_time(out, scale, dilation)


def load_yaml(text: str, file: str) -> Any:
    """A YAML document of ours (topology, scenario), refusing bad YAML and any key given twice
    (YAML would silently keep the second) with the line."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(e, "problem", None) or str(e)
        raise SpecError(file, "", f"not valid YAML: {where}{problem}") from None
    dup = _duplicate_key(yaml.compose(text, Loader=yaml.SafeLoader))
    if dup is not None:
        path, first, again = dup
        raise SpecError(file, path, f"given twice (lines {first} and {again}); YAML would silently keep the "
                                    "second: remove one")
    return doc


def parse(text: str, file: str = "<string>") -> FabricSpec:
    """Validate the YAML text of a topology; ``file`` is used in error messages."""
    doc = load_yaml(text, file)
    r = _Reader(file)
    top = r.mapping(
        doc,
        "",
        ("version", "scale", "dilation", "mtu", "shaper", "addressing", "links", "latency", "buffers",
         "datacenters", "wan", "ecmp", "ecn", "pfc", "nic", "routes"),
    )
    version = r.get(top, "", "version", _int(1))
    if version != FORMAT_VERSION:
        raise r.fail("version", f"format version {version} is not supported; this backplane reads {FORMAT_VERSION}")
    scale = r.get(top, "", "scale", _scale, 0.001)
    tm = time_model(scale, r.get(top, "", "dilation", _dilation, "realtime"), file)
    mtu = r.get(top, "", "mtu", _int(ROCE_MAX_PACKET, 9216), 4200)
    shaper = r.get(top, "", "shaper", _choice(SHAPERS), "htb")
    addressing = _addressing(r, top)
    links = _links(r, top)
    buffers = _buffers(r, top)
    datacenters = _datacenters(r, top)
    wan_paths = _wan(r, top, mtu)
    nic = _nic(r, top)
    spec = FabricSpec(
        source=file,
        version=version,
        scale=scale,
        mtu=mtu,
        dilation=tm.dilation,
        dilation_preset=tm.preset,
        shaper=shaper,
        addressing=addressing,
        links=links,
        buffers=buffers,
        datacenters=datacenters,
        wan_paths=wan_paths,
        ecmp=_ecmp(r, top),
        ecn=_ecn(r, top, nic, links),
        pfc=_pfc(r, top),
        nic=nic,
        latency=_latency(r, top),
        routes=_routes(r, top),
    )
    _check_whole(r, spec, top)
    return spec


def parse_dilation(text: str | None) -> float | str | None:
    """A dilation as given on a command line: a number, or a preset's name (checked later)."""
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        return text.strip()


def with_time(spec: FabricSpec, scale: float | None = None, dilation: float | str | None = None) -> FabricSpec:
    """``spec`` run at another scale (``up --scale``: what this machine's CPU keeps up with) and
    dilation (``up --dilation``), either kept when None (a preset follows the scale: faithful
    stays 1/scale), checked as the file's own would be."""
    where = "--dilation" if dilation is not None else "--scale"
    if scale is not None:
        try:
            scale = _scale(scale)
        except ValueError as e:
            raise SpecError(spec.source, "--scale", str(e)) from None
    tm = time_model(spec.scale if scale is None else scale,
                    dilation if dilation is not None else (spec.dilation_preset or spec.dilation), spec.source, where)
    out = replace(spec, scale=tm.scale, dilation=tm.dilation, dilation_preset=tm.preset)
    _check_whole(_Reader(spec.source), out, {})
    return out


def with_dilation(spec: FabricSpec, dilation: float | str) -> FabricSpec:
    """``spec`` run at another dilation (``up --dilation``)."""
    return with_time(spec, dilation=dilation)


def _latency(r: _Reader, top: dict) -> Latency:
    m = r.mapping(top.get("latency"), "latency", ("cable", "switch"))
    return Latency(cable_m=r.get(m, "latency", "cable", _non_negative(units.parse_distance, "distance"),
                                 Latency.cable_m),
                   switch_s=r.get(m, "latency", "switch", _non_negative(units.parse_duration, "duration"),
                                  Latency.switch_s))


def _addressing(r: _Reader, top: dict) -> Addressing:
    m = r.mapping(top.get("addressing"), "addressing", ("hosts", "host_prefix", "links"))
    hosts = r.get(m, "addressing", "hosts", _network, ipaddress.IPv4Network("198.18.0.0/16"))
    host_prefix = r.get(m, "addressing", "host_prefix", _int(8, 30), 24)
    links = r.get(m, "addressing", "links", _network, ipaddress.IPv4Network("198.19.0.0/16"))
    if host_prefix < hosts.prefixlen:
        raise r.fail("addressing.host_prefix", f"/{host_prefix} is wider than addressing.hosts {hosts}")
    if links.prefixlen > 31:
        raise r.fail("addressing.links", f"{links} holds no /31 point-to-point subnet")
    if hosts.overlaps(links):
        raise r.fail("addressing.links", f"{links} overlaps addressing.hosts {hosts}")
    return Addressing(hosts=hosts, host_prefix=host_prefix, links=links)


def _links(r: _Reader, top: dict) -> LinkRates:
    m = r.mapping(top.get("links"), "links", ("host", "fabric", "border"))
    return LinkRates(
        host=r.get(m, "links", "host", _rate, 400_000_000_000),
        fabric=r.get(m, "links", "fabric", _rate, 400_000_000_000),
        border=r.get(m, "links", "border", _rate, 400_000_000_000),
    )


def _buffers(r: _Reader, top: dict) -> Buffers:
    m = r.mapping(top.get("buffers"), "buffers", ("host", "switch", "border"))
    return Buffers(
        host=r.get(m, "buffers", "host", _size, 16_000_000),
        switch=r.get(m, "buffers", "switch", _size, 16_000_000),
        border=r.get(m, "buffers", "border", _size, 1_000_000_000),
    )


def _datacenters(r: _Reader, top: dict) -> tuple[DataCenter, ...]:
    raw = top.get("datacenters")
    if raw is None:
        raise r.fail("datacenters", "is required")
    if not isinstance(raw, list):
        raise r.fail("datacenters", f"must be a list, got {_type_name(raw)}")
    if len(raw) not in (1, 2):
        raise r.fail("datacenters", f"backplane builds 1 or 2 datacenters, got {len(raw)}")
    out = []
    for i, item in enumerate(raw):
        path = f"datacenters[{i}]"
        m = r.mapping(item, path, ("name", "spines", "leaves", "hosts_per_leaf", "borders"))
        dc = DataCenter(
            name=r.get(m, path, "name", _name),
            spines=r.get(m, path, "spines", _int(1, 64)),
            leaves=r.get(m, path, "leaves", _int(1, 256)),
            hosts_per_leaf=r.get(m, path, "hosts_per_leaf", _int(1)),
            borders=r.get(m, path, "borders", _int(0, 16), 1 if len(raw) == 2 else 0),
        )
        if any(prev.name == dc.name for prev in out):
            raise r.fail(f"{path}.name", f"{dc.name!r} is already the name of another datacenter")
        out.append(dc)
    return tuple(out)


def _wan(r: _Reader, top: dict, mtu: int) -> tuple[WanPath, ...]:
    if "wan" not in top:
        return ()
    m = r.mapping(top["wan"], "wan", ("paths", "distance", "rate", "loss", "corruption", "ber", "overrides"))
    count = r.get(m, "wan", "paths", _int(1, 64))
    base = {
        "distance": r.get(m, "wan", "distance", _distance),
        "rate": r.get(m, "wan", "rate", _rate),
        "loss": r.get(m, "wan", "loss", _loss_rate, 0.0),
        "corruption": r.get(m, "wan", "corruption", _loss_rate, None),
        "ber": r.get(m, "wan", "ber", _probability, None),
    }
    if base["corruption"] is not None and base["ber"] is not None:
        raise r.fail("wan.ber", "give either corruption (per packet) or ber (per bit), not both")
    overrides = m.get("overrides") or {}
    if not isinstance(overrides, dict):
        raise r.fail("wan.overrides", f"must be a mapping of path index to settings, got {_type_name(overrides)}")
    per_path: dict[int, dict] = {}
    for key, value in overrides.items():
        where = f"wan.overrides.{key}"
        if isinstance(key, bool) or not isinstance(key, int) or not 0 <= key < count:
            raise r.fail(where, f"path index must be an integer in 0..{count - 1}")
        o = r.mapping(value, where, ("distance", "rate", "loss", "corruption", "ber"))
        got = {
            "distance": r.get(o, where, "distance", _distance, None),
            "rate": r.get(o, where, "rate", _rate, None),
            "loss": r.get(o, where, "loss", _loss_rate, None),
            "corruption": r.get(o, where, "corruption", _loss_rate, None),
            "ber": r.get(o, where, "ber", _probability, None),
        }
        if got["corruption"] is not None and got["ber"] is not None:
            raise r.fail(f"{where}.ber", "give either corruption (per packet) or ber (per bit), not both")
        per_path[key] = {k: v for k, v in got.items() if v is not None}
    frame_bits = 8 * (mtu + ETH_HEADER)
    paths = []
    for i in range(count):
        p = dict(base)
        if "corruption" in per_path.get(i, {}) or "ber" in per_path.get(i, {}):
            p["corruption"] = p["ber"] = None
        p.update(per_path.get(i, {}))
        ber = p["ber"] or 0.0
        # netem corrupts one bit of a packet with a per-packet probability: for a BER, that is the
        # chance that a full-size frame carries at least one flipped bit.
        corruption = p["corruption"] if p["corruption"] is not None else 1.0 - (1.0 - ber) ** frame_bits
        paths.append(WanPath(i, p["distance"], p["rate"], p["loss"], corruption, ber))
    return tuple(paths)


def _ecmp(r: _Reader, top: dict) -> Ecmp:
    m = r.mapping(top.get("ecmp"), "ecmp", ("hash", "datapath", "adaptive", "flowlet_gap", "adaptive_interval",
                                            "health_threshold"))
    out = Ecmp(hash=r.get(m, "ecmp", "hash", _choice(HASH_MODES), "five-tuple"),
               datapath=r.get(m, "ecmp", "datapath", _choice(DATAPATHS), "ebpf"),
               adaptive=r.get(m, "ecmp", "adaptive", _choice(ADAPTIVE_MODES), "off"),
               flowlet_gap_s=r.get(m, "ecmp", "flowlet_gap", _non_negative(units.parse_duration, "flowlet_gap"), None),
               adaptive_interval_s=r.get(m, "ecmp", "adaptive_interval",
                                         _positive(units.parse_duration, "adaptive_interval"), 100e-6),
               health_threshold=r.get(m, "ecmp", "health_threshold", _fraction, 1e-3))
    if out.adaptive != "off" and out.datapath != "ebpf":
        raise r.fail("ecmp.adaptive", "adaptive routing runs in the eBPF datapath (ecmp.datapath: ebpf)")
    return out


def _pfc(r: _Reader, top: dict) -> Pfc:
    m = r.mapping(top.get("pfc"), "pfc", ("enabled", "priority", "xoff", "xon", "headroom", "long_haul",
                                          "deadlock_avoidance", "tagger_priority", "watchdog"))
    w = r.mapping(m.get("watchdog"), "pfc.watchdog", ("enabled", "detection_time", "restoration_time", "action",
                                                       "poll_interval"))
    pfc = Pfc(
        enabled=r.get(m, "pfc", "enabled", _bool, False),
        priority=r.get(m, "pfc", "priority", _int(0, 7), 3),
        xoff=r.get(m, "pfc", "xoff", _size, Pfc.xoff),
        xon=r.get(m, "pfc", "xon", _size, Pfc.xon),
        headroom=r.get(m, "pfc", "headroom", _size, None),
        long_haul=r.get(m, "pfc", "long_haul", _bool, False),
        deadlock_avoidance=r.get(m, "pfc", "deadlock_avoidance", _choice(DEADLOCK_AVOIDANCE), "none"),
        tagger_priority=r.get(m, "pfc", "tagger_priority", _int(0, 7), 4),
        watchdog=PfcWatchdog(
            detection_time=r.get(w, "pfc.watchdog", "detection_time", _duration, 0.2),
            restoration_time=r.get(w, "pfc.watchdog", "restoration_time", _duration, 0.2),
            action=r.get(w, "pfc.watchdog", "action", _choice(PFC_WATCHDOG_ACTIONS), "drop"),
            enabled=r.get(w, "pfc.watchdog", "enabled", _bool, True),
            poll_interval=r.get(w, "pfc.watchdog", "poll_interval", _duration, 0.2),
        ),
    )
    if pfc.xon > pfc.xoff:
        raise r.fail("pfc.xon", f"must not exceed pfc.xoff ({pfc.xon} > {pfc.xoff} bytes)")
    for key in ("priority", "tagger_priority"):
        if getattr(pfc, key) in RESERVED_PRIORITIES:
            raise r.fail(f"pfc.{key}", f"priority {getattr(pfc, key)} is the QoS policy's (0 lossy, 6 CNPs)")
    if pfc.deadlock_avoidance == "tagger" and pfc.tagger_priority == pfc.priority:
        raise r.fail("pfc.tagger_priority", f"must differ from pfc.priority ({pfc.priority}): bounced packets "
                                            "move to another lossless priority")
    return pfc


@dataclass(frozen=True)
class RouteOverride:
    """A static route that replaces the computed one: on ``node``, ``to``'s hosts go via
    neighbour ``via`` (what a failure's stale state or a misconfiguration leaves)."""

    node: str
    to: str
    via: str


def _routes(r: _Reader, top: dict) -> tuple[RouteOverride, ...]:
    items = top.get("routes")
    if items is None:
        return ()
    if not isinstance(items, list):
        raise r.fail("routes", f"must be a list of {{node, to, via}}, got {_type_name(items)}")
    out = []
    for i, item in enumerate(items):
        path = f"routes[{i}]"
        m = r.mapping(item, path, ("node", "to", "via"))
        out.append(RouteOverride(*(r.get(m, path, key, _node_name) for key in ("node", "to", "via"))))
    return tuple(out)


def _node_name(value: Any) -> str:
    if not isinstance(value, str) or not re.match(r"^[a-z0-9-]{1,40}$", value):
        raise ValueError(f"must be a node's name such as dc-leaf0, got {value!r}")
    return value


# nic.dcqcn as a mapping: ``profile`` plus any of these, each overriding one Profile field
# (real units; the emulation scales rates and bytes with the topology's scale).
def _zero_or(parse: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """A quantity that may also be a bare 0 (off)."""
    return lambda v: 0 if v == 0 and not isinstance(v, bool) else parse(v)


def _share(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise ValueError(f"must be a number in [0, 1] such as 0.5, got {value!r}")
    return float(value)


DCQCN_FIELDS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "g": ("g", _fraction),
    "cnp_interval": ("cnp_interval_s", _zero_or(_duration)),  # N; 0: a CNP per marked packet
    "cnp_defer": ("cnp_defer", _bool),  # a mark inside N gets one CNP when N has passed
    "cnp_delay": ("cnp_delay_s", _zero_or(_duration)),  # the receiving NIC's processing
    "reaction_delay": ("reaction_delay_s", _zero_or(_duration)),  # the sending NIC's processing
    "alpha_rule": ("alpha_rule", _choice(dcqcn_mod.ALPHA_RULES)),
    "initial_alpha": ("initial_alpha", _share),
    "rate_decrease_period": ("rate_decrease_period_s", _zero_or(_duration)),  # 0: cut on every CNP
    "clamp": ("clamp", _choice(dcqcn_mod.CLAMPS)),
    "min_dec_factor": ("min_dec_factor", _share),
    "stage_rule": ("stage_rule", _choice(dcqcn_mod.STAGE_RULES)),
    "hyper_step": ("hyper_step", _choice(dcqcn_mod.HYPER_STEPS)),
    "alpha_period": ("alpha_period_s", _duration),  # K
    "timer": ("timer_s", _duration),  # T
    "byte_counter": ("byte_counter", lambda v: 0 if v == 0 and not isinstance(v, bool) else _size(v)),  # B; 0: timer only
    "fast_recovery": ("fast_recovery", _int(1, 1000)),  # F
    "rate_ai": ("rate_ai_bps", _rate),
    "rate_hai": ("rate_hai_bps", _rate),
    "min_rate": ("min_rate_bps", _rate),
    "kmin": ("kmin", _size),
    "kmax": ("kmax", _size),
    "pmax": ("pmax", _probability),
}


def _dcqcn_name(value: Any) -> str:
    # YAML 1.1 reads a bare `off` as false: that is the profile the user wrote.
    return _choice(DCQCN_PROFILES)("off" if value is False else value)


def _nic(r: _Reader, top: dict) -> Nic:
    m = r.mapping(top.get("nic"), "nic", ("transport", "dcqcn", "qps_per_pair", "window"))
    raw = m.get("dcqcn", "paper")
    overrides: list[tuple[str, Any]] = []
    if isinstance(raw, dict):
        d = r.mapping(raw, "nic.dcqcn", ("profile", *DCQCN_FIELDS))
        name = r.get(d, "nic.dcqcn", "profile", _dcqcn_name)
        for key, (fname, parse) in DCQCN_FIELDS.items():
            if key in d:
                overrides.append((fname, r.get(d, "nic.dcqcn", key, parse)))
        if name == "off" and overrides:
            raise r.fail("nic.dcqcn", f"profile off runs no DCQCN; it takes no fields ({', '.join(k for k in d if k != 'profile')})")
    else:
        name = r.get(m, "nic", "dcqcn", _dcqcn_name, "paper")
    return Nic(
        transport=r.get(m, "nic", "transport", _choice(TRANSPORTS), "selective"),
        dcqcn=name,
        qps_per_pair=r.get(m, "nic", "qps_per_pair", _int(1, 1024), 1),
        window=r.get(m, "nic", "window", _choice(WINDOWS), "bdp"),
        dcqcn_overrides=tuple(overrides),
    )


def _ecn(r: _Reader, top: dict, nic: Nic, links: LinkRates) -> Ecn:
    """The switches' ECN thresholds, field by field: the topology's ``ecn`` section first, then
    what the NIC's DCQCN profile names (hpcc-ns3's grow with the host link's rate), then the
    DCQCN paper's defaults."""
    m = r.mapping(top.get("ecn"), "ecn", ("kmin", "kmax", "pmax"))
    parsers = {"kmin": _size, "kmax": _size, "pmax": _probability}
    prof = nic.dcqcn_profile(links.host)
    values, sources = {}, []
    for key, parse in parsers.items():
        if key in m:
            values[key], src = r.get(m, "ecn", key, parse), "ecn"
        elif getattr(prof, key) is not None:
            values[key], src = getattr(prof, key), f"profile {prof.name}"
        else:
            values[key], src = getattr(Ecn, key), "default"
        sources.append(src)
    ecn = Ecn(values["kmin"], values["kmax"], values["pmax"], tuple(sources))
    if ecn.kmax < ecn.kmin:
        where = "ecn.kmax" if "kmax" in m or "kmin" in m else "nic.dcqcn"
        said = {"ecn": "set in ecn", "default": "the DCQCN paper's default"}
        origin = [said.get(src, f"from DCQCN {src}") for src in sources]
        raise r.fail(where, f"kmax {units.format_size(ecn.kmax)} ({origin[1]}) is below kmin "
                            f"{units.format_size(ecn.kmin)} ({origin[0]}): switches mark with a probability "
                            "rising from kmin to kmax, so kmax must be at least kmin")
    return ecn


def _check_whole(r: _Reader, spec: FabricSpec, top: dict) -> None:
    """Checks that involve more than one field."""
    if spec.cross_dc:
        if not spec.wan_paths:
            raise r.fail("wan", "two datacenters need long-haul paths: add wan.paths, wan.distance and wan.rate")
        for i, dc in enumerate(spec.datacenters):
            if dc.borders < 1:
                raise r.fail(f"datacenters[{i}].borders", "a datacenter joined by the WAN needs at least 1 border")
    elif spec.wan_paths:
        raise r.fail("wan", "long-haul paths join two datacenters; this file has one")
    # Addresses: one subnet per leaf, hosts plus the leaf's gateway and the network/broadcast.
    a = spec.addressing
    per_subnet = 2 ** (32 - a.host_prefix) - 3
    for i, dc in enumerate(spec.datacenters):
        if dc.hosts_per_leaf > per_subnet:
            raise r.fail(
                f"datacenters[{i}].hosts_per_leaf",
                f"{dc.hosts_per_leaf} hosts do not fit a /{a.host_prefix} leaf subnet "
                f"({per_subnet} addresses); lower it or widen addressing.host_prefix",
            )
    leaves = sum(dc.leaves for dc in spec.datacenters)
    subnets = 2 ** (a.host_prefix - a.hosts.prefixlen)
    if leaves > subnets:
        raise r.fail("addressing.hosts", f"{a.hosts} holds {subnets} /{a.host_prefix} leaf subnets; the fabric has {leaves} leaves")
    p2p = sum(dc.leaves * dc.spines + dc.spines * dc.borders for dc in spec.datacenters) + len(spec.wan_paths)
    if p2p > a.links.num_addresses // 2:
        raise r.fail("addressing.links", f"{a.links} holds {a.links.num_addresses // 2} /31 subnets; the fabric has {p2p} point-to-point links")
    # Emulated rates and buffers must be ones the kernel can run.
    rates = [("links.host", spec.links.host), ("links.fabric", spec.links.fabric), ("links.border", spec.links.border)]
    rates += [(f"wan.rate (path {p.index})", p.rate_bps) for p in spec.wan_paths]
    for where, bps in rates:
        emulated = spec.emulated_rate(bps)
        if not MIN_EMULATED_RATE <= emulated <= MAX_EMULATED_RATE:
            raise r.fail(
                where.split(" ")[0],
                f"{units.format_rate(bps)} at scale {spec.scale} runs at {units.format_rate(emulated)}, "
                f"outside the {units.format_rate(MIN_EMULATED_RATE)}..{units.format_rate(MAX_EMULATED_RATE)} "
                "an emulated port can shape; change scale",
            )
    frame = spec.mtu + ETH_HEADER
    tm = spec.time
    for name in ("host", "switch", "border"):
        real = getattr(spec.buffers, name)
        emulated = spec.emulated_size(real)
        if emulated < frame:
            raise r.fail(
                f"buffers.{name}",
                f"{units.format_size(real)} at scale {spec.scale:g} and dilation {tm.dilation:g} is {emulated} "
                f"bytes, less than one {frame}-byte frame",
            )
        if emulated > MAX_EMULATED_BUFFER:
            raise r.fail(
                f"buffers.{name}",
                f"{units.format_size(real)} at scale {spec.scale:g} and dilation {tm.dilation:g} is "
                f"{units.format_size(emulated)}, more than a queue's 32-bit byte limit holds "
                f"({units.format_size(MAX_EMULATED_BUFFER)}); lower the dilation or the buffer",
            )
    for p in spec.wan_paths:
        if spec.emulated_time(p.delay_s) > MAX_NETEM_DELAY_S:
            raise r.fail("dilation", f"long-haul path {p.index}'s {units.format_duration(p.delay_s)} at dilation "
                                     f"{tm.dilation:g} is {units.format_duration(spec.emulated_time(p.delay_s))} of "
                                     f"wall time, more than netem holds ({MAX_NETEM_DELAY_S:g} s); lower the dilation")
    if spec.pfc.enabled and spec.emulated_size(spec.pfc.xon) < 1:
        raise r.fail("pfc.xon", "scales to 0 bytes")
    from emulator.model import pfc as pfc_model  # it reads this module's dataclasses

    for where, why in pfc_model.problems(spec):
        raise r.fail(where, why)

