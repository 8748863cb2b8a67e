"""The fabric as a pure graph: nodes, ports, addresses, egress queues and routes.

Computed from a FabricSpec and a fabric name with no side effects, so the addressing plan and
the routing tables are tested without root. Everything is deterministic: the same spec and name
give the same names, addresses, MACs and routes every time.

Names carry the fabric's prefix ``bp-<name>-`` (namespaces, Mininet node shells), which is how
``down`` and ``clean`` find what the project made, and only that.
"""
from __future__ import annotations

import functools

import ipaddress
import math
import re
from collections import deque
from dataclasses import dataclass, replace
from typing import Iterator

from emulator.errors import BackplaneError, SpecError, UsageError
from emulator.model import pfc as pfc_model
from emulator.model.spec import ETH_HEADER, MAX_EMULATED_BUFFER, FabricSpec, WanPath

PROJECT_PREFIX = "bp-"
DEFAULT_NAME = "main"
_FABRIC_NAME = re.compile(r"^[a-z0-9]{1,12}$")
# Reserved: throwaway namespaces of capability probes are named bp-probe-<pid>.
RESERVED_NAMES = ("probe",)
# netem's queue must hold the path's bandwidth-delay product even in minimum-size frames, with
# 50% to spare, so the delay line itself never drops at line rate.
NETEM_BDP_FACTOR = 1.5
MIN_FRAME = 64
# Below this a dilated in-DC delay is shorter than the emulator's own forwarding of one hop and
# than netem's timer slack: not installed, and status says so.
MIN_NETEM_DELAY_S = 10e-6
# Ports get ifindexes from here up, one per port, the same in every namespace's numbering space.
FIRST_IFINDEX = 100
# Frames the qdisc holds beyond the switch buffer the egress program enforces: covers packets
# admitted at once on different CPUs.
QDISC_HEADROOM_FRAMES = 16
SWITCH_ROLES = ("leaf", "spine", "border")

ROLES = ("host", "leaf", "spine", "border", "fiber")


class FabricNameError(BackplaneError):
    """A fabric name that cannot carry the prefix."""

    exit_code = 2


def check_name(name: str) -> str:
    if not _FABRIC_NAME.match(name or ""):
        raise FabricNameError(f"fabric name {name!r}: use 1-12 lower-case letters or digits")
    if name in RESERVED_NAMES:
        raise FabricNameError(f"fabric name {name!r} is reserved")
    return name


def prefix_of(name: str) -> str:
    return f"{PROJECT_PREFIX}{check_name(name)}-"


@dataclass(frozen=True)
class Shaping:
    """A rate-shaped egress queue: HTB or TBF at ``rate_bps`` over a ``buffer_bytes`` FIFO."""

    shaper: str
    rate_bps: int  # emulated
    buffer_bytes: int  # emulated
    real_rate_bps: int
    real_buffer_bytes: int
    # The qdisc's own limit. With the eBPF datapath the egress program tail-drops at
    # buffer_bytes, so the qdisc holds a little more and never drops: queue accounting stays exact.
    qdisc_limit: int
    # Wall seconds of in-DC latency (cables and switches, dilated) held by a netem under the
    # shaper, on host ports only: switch queues stay pure FIFOs so their depth stays exact.
    # Installed only where the kernel has netem and the delay is worth a timer (MIN_NETEM_DELAY_S).
    delay_s: float = 0.0
    delay_limit_packets: int = 0  # that netem's queue: the delay's BDP and the buffer, in small frames
    # With PFC: one HTB leaf per priority, each behind a pause gate (a TBF), and a control class
    # for PAUSE frames; the lossless leaves hold up to this many bytes (the eBPF admission, or
    # on a host the sockets' send buffers, is what limits them, so the qdisc never drops).
    priorities: bool = False
    lossless_limit: int = 0


@dataclass(frozen=True)
class DelayLine:
    """A fiber's netem egress: propagation delay, loss and corruption, never a bottleneck."""

    delay_s: float
    loss: float
    corruption: float
    limit_packets: int  # >= NETEM_BDP_FACTOR x BDP in minimum-size frames
    path: int


@dataclass(frozen=True)
class Port:
    node: str
    ifname: str
    mac: str
    address: ipaddress.IPv4Interface | None  # None on fiber ports (a bridge: no IP)
    peer_node: str
    peer_ifname: str
    egress: Shaping | DelayLine | None
    ifindex: int = 0  # unique across the fabric, so eBPF maps shared by all switches can key on it


@dataclass(frozen=True)
class Link:
    kind: str  # host | fabric | border | wan
    a: Port
    b: Port
    path: int | None = None  # long-haul path index for wan links


@dataclass(frozen=True)
class Node:
    name: str  # short, e.g. east-leaf0
    role: str
    dc: str | None
    index: int
    uid: int = 0  # 1.. in plan order: the node's id in the datapath (and its ECMP hash seed)


@dataclass(frozen=True)
class Route:
    dst: ipaddress.IPv4Network
    nexthops: tuple[tuple[str, str], ...]  # (gateway address or "" for on-link, local ifname)


@dataclass(frozen=True)
class FabricPlan:
    name: str
    spec: FabricSpec
    nodes: tuple[Node, ...]
    links: tuple[Link, ...]
    routes: dict[str, tuple[Route, ...]]  # node -> routes beyond the connected ones

    @property
    def prefix(self) -> str:
        return prefix_of(self.name)

    def netns(self, node: str) -> str:
        return f"{self.prefix}{node}"

    @functools.cached_property
    def _nodes_by_name(self) -> dict[str, Node]:
        return {n.name: n for n in self.nodes}

    @functools.cached_property
    def _ports_by_node(self) -> dict[str, list[Port]]:
        """Each node's ports in link order: looked up per port while a fabric is built, so a
        scan of every link each time would make a thousand-node build quadratic."""
        out: dict[str, list[Port]] = {}
        for link in self.links:
            for port in (link.a, link.b):
                out.setdefault(port.node, []).append(port)
        return out

    @functools.cached_property
    def _port_by_name(self) -> dict[tuple[str, str], Port]:
        return {(p.node, p.ifname): p for ports in self._ports_by_node.values() for p in ports}

    def node(self, name: str) -> Node:
        try:
            return self._nodes_by_name[name]
        except KeyError:
            raise KeyError(name) from None

    def by_role(self, role: str) -> list[Node]:
        return [n for n in self.nodes if n.role == role]

    def ports(self, node: str | None = None) -> Iterator[Port]:
        if node is not None:
            yield from self._ports_by_node.get(node, ())
            return
        for link in self.links:
            yield link.a
            yield link.b

    def port(self, node: str, ifname: str) -> Port:
        try:
            return self._port_by_name[(node, ifname)]
        except KeyError:
            raise KeyError(f"{node}:{ifname}") from None

    def peer(self, port: Port) -> Port:
        return self.port(port.peer_node, port.peer_ifname)

    def next_hop(self, port: Port) -> Port:
        """The port of the next IP node behind ``port``: its peer, or across a fiber's bridge."""
        peer = self.peer(port)
        if self.node(peer.node).role != "fiber":
            return peer
        other = next(p for p in self.ports(peer.node) if p.ifname != peer.ifname)
        return self.peer(other)

    def host_address(self, node: str) -> ipaddress.IPv4Address:
        for port in self.ports(node):
            if port.address is not None:
                return port.address.ip
        raise KeyError(node)

    def link_between(self, src: str, dst: str, path_index: int | None = None) -> tuple[Port, Port, Port | None]:
        """The egress port of ``src`` towards its neighbour ``dst``, the port that receives on
        ``dst`` and, for two borders joined through a fiber, the fiber's delay-line port towards
        ``dst`` (else None). ``path_index`` picks one long-haul path between two borders."""
        for name in (src, dst):
            try:
                self.node(name)
            except KeyError:
                raise UsageError(f"no node {name!r} in fabric {self.name!r}") from None
        paths = sorted({link.path for link in self.links if link.kind == "wan"})
        if path_index is not None and path_index not in paths:
            have = ", ".join(map(str, paths)) if paths else "none"
            raise UsageError(f"no long-haul path {path_index} in fabric {self.name!r} (its paths: {have})")
        if path_index is None:
            for link in self.links:
                for a, b in ((link.a, link.b), (link.b, link.a)):
                    if a.node == src and b.node == dst:
                        return a, b, None
        # Two borders are neighbours through a fiber: the border's own port is the shaped one.
        wan = [link for link in self.links if link.kind == "wan"]
        for link in wan:
            for mine, fiber_in in ((link.a, link.b), (link.b, link.a)):
                if mine.node != src or (path_index is not None and link.path != path_index):
                    continue
                for other in wan:
                    if other is link or other.path != link.path:
                        continue
                    for fiber_out, theirs in ((other.a, other.b), (other.b, other.a)):
                        if theirs.node == dst and fiber_out.node == fiber_in.node:
                            return mine, theirs, fiber_out
        where = f" over long-haul path {path_index}" if path_index is not None else ""
        raise UsageError(f"{src} and {dst} are not neighbours{where} in fabric {self.name!r}")

    def wan_delay_s(self) -> float:
        """The longest long-haul path's one-way delay as the emulation runs it (wall seconds:
        the real delay x dilation)."""
        return max((self.spec.emulated_time(p.delay_s) for p in self.spec.wan_paths), default=0.0)

    def link_of(self, port: Port) -> Link:
        for link in self.links:
            if port in (link.a, link.b):
                return link
        raise KeyError(f"{port.node}:{port.ifname}")

    def pfc_port(self, port: Port) -> bool:
        """Whether PFC runs on ``port``'s link: every link but the long-haul ones, whose
        WAN-facing border ports stay lossy (spec checks refuse lossless across them)."""
        return self.spec.pfc.enabled and self.link_of(port).kind != "wan"

    def intra_delay_applies(self, has_netem: bool) -> bool:
        """Whether the hosts' egress netem holds the in-DC latency: a kernel with netem and a
        dilated delay worth a timer."""
        return has_netem and any(isinstance(p.egress, Shaping) and p.egress.delay_s >= MIN_NETEM_DELAY_S
                                 for p in self.ports())


def _mac(node_id: int, port: int) -> str:
    # Locally administered, "bp" in the second and third bytes, then node and port numbers.
    return f"02:62:70:{node_id >> 8:02x}:{node_id & 0xFF:02x}:{port:02x}"


def build(spec: FabricSpec, name: str = DEFAULT_NAME) -> FabricPlan:
    """Lay out the nodes, links, addresses, queues and routes of ``spec``."""
    check_name(name)
    nodes: list[Node] = []
    for dc in spec.datacenters:
        nodes += [Node(f"{dc.name}-spine{i}", "spine", dc.name, i) for i in range(dc.spines)]
        nodes += [Node(f"{dc.name}-leaf{i}", "leaf", dc.name, i) for i in range(dc.leaves)]
        nodes += [Node(f"{dc.name}-border{i}", "border", dc.name, i) for i in range(dc.borders)]
        nodes += [Node(f"{dc.name}-host{i}", "host", dc.name, i) for i in range(dc.leaves * dc.hosts_per_leaf)]
    nodes += [Node(f"wan{p.index}", "fiber", None, p.index) for p in spec.wan_paths]
    nodes = [Node(n.name, n.role, n.dc, n.index, i + 1) for i, n in enumerate(nodes)]
    node_ids = {n.name: n.uid for n in nodes}
    role = {n.name: n.role for n in nodes}
    ifindexes = iter(range(FIRST_IFINDEX, 1 << 30))
    next_port = {n.name: 0 for n in nodes}

    host_subnets = spec.addressing.hosts.subnets(new_prefix=spec.addressing.host_prefix)
    p2p_subnets = spec.addressing.links.subnets(new_prefix=31)

    # A lossless leaf may hold XOFF + headroom from every other port of its switch at once.
    most_ports = 1 + max((dc.spines + dc.hosts_per_leaf for dc in spec.datacenters), default=0) + \
        max((dc.leaves + dc.borders for dc in spec.datacenters), default=0) + len(spec.wan_paths)
    lossless_limit = 0
    if spec.pfc.enabled:
        worst = max(pfc_model.reserved(spec, kind) for kind in ("host", "fabric", "border"))
        lossless_limit = min(MAX_EMULATED_BUFFER, spec.emulated_size(most_ports * (spec.pfc.xoff + worst)))

    def shaping(real_rate: int, real_buffer: int, delay_s: float = 0.0) -> Shaping:
        buf = spec.emulated_size(real_buffer)
        rate = spec.emulated_rate(real_rate)
        limit = 0
        if delay_s:
            limit = math.ceil((NETEM_BDP_FACTOR * rate / 8 * delay_s + buf) / MIN_FRAME)
        return Shaping(spec.shaper, rate, buf, real_rate, real_buffer, buf, delay_s, limit,
                       spec.pfc.enabled, max(lossless_limit, buf))

    def port(node: str, address, peer: str, egress) -> Port:
        k = next_port[node]
        next_port[node] += 1
        if isinstance(egress, Shaping) and role[node] in SWITCH_ROLES and spec.ecmp.datapath == "ebpf":
            egress = replace(egress, qdisc_limit=egress.buffer_bytes + QDISC_HEADROOM_FRAMES * (spec.mtu + ETH_HEADER))
        return Port(node, f"eth{k}", _mac(node_ids[node], k), address, peer, "", egress, next(ifindexes))

    def pair(kind: str, a: Port, b: Port, path: int | None = None) -> Link:
        a = Port(a.node, a.ifname, a.mac, a.address, b.node, b.ifname, a.egress, a.ifindex)
        b = Port(b.node, b.ifname, b.mac, b.address, a.node, a.ifname, b.egress, b.ifindex)
        return Link(kind, a, b, path)

    def p2p() -> tuple[ipaddress.IPv4Interface, ipaddress.IPv4Interface]:
        net = next(p2p_subnets)
        return (ipaddress.IPv4Interface(f"{net[0]}/31"), ipaddress.IPv4Interface(f"{net[1]}/31"))

    links: list[Link] = []
    sw_buf, host_buf, border_buf = spec.buffers.switch, spec.buffers.host, spec.buffers.border
    # Each host's egress holds the one-way in-DC latency: every path between two hosts (and
    # each host's share of a cross-DC path) then has it once each way.
    host_delay = spec.emulated_time(spec.intra_dc_one_way_s())
    rates = spec.links
    for dc in spec.datacenters:
        for leaf in range(dc.leaves):
            lname = f"{dc.name}-leaf{leaf}"
            subnet = next(host_subnets)
            # The leaf routes its host ports like a ToR with unnumbered ports: the gateway address
            # as a /32 on each, and a /32 route per host, so one /24 per leaf is all the rest of
            # the fabric needs to know.
            gateway = ipaddress.IPv4Interface(f"{subnet[1]}/32")
            for h in range(dc.hosts_per_leaf):
                hname = f"{dc.name}-host{leaf * dc.hosts_per_leaf + h}"
                haddr = ipaddress.IPv4Interface(f"{subnet[2 + h]}/{subnet.prefixlen}")
                a = port(hname, haddr, lname, shaping(rates.host, host_buf, host_delay))
                b = port(lname, gateway, hname, shaping(rates.host, sw_buf))
                links.append(pair("host", a, b))
    for dc in spec.datacenters:
        for leaf in range(dc.leaves):
            for sp in range(dc.spines):
                la, sa = p2p()
                lname, sname = f"{dc.name}-leaf{leaf}", f"{dc.name}-spine{sp}"
                links.append(pair("fabric", port(lname, la, sname, shaping(rates.fabric, sw_buf)),
                                  port(sname, sa, lname, shaping(rates.fabric, sw_buf))))
        for sp in range(dc.spines):
            for bd in range(dc.borders):
                sa, ba = p2p()
                sname, bname = f"{dc.name}-spine{sp}", f"{dc.name}-border{bd}"
                links.append(pair("border", port(sname, sa, bname, shaping(rates.border, sw_buf)),
                                  port(bname, ba, sname, shaping(rates.border, border_buf))))
    if spec.cross_dc:
        east, west = spec.datacenters
        for p in spec.wan_paths:
            ea, wa = p2p()
            eb = f"{east.name}-border{p.index % east.borders}"
            wb = f"{west.name}-border{p.index % west.borders}"
            fiber = f"wan{p.index}"
            line = delay_line(spec, p)
            # The border's egress is the real shaped queue; the fiber only delays, so the 15 ms in
            # flight never counts as congestion.
            links.append(pair("wan", port(eb, ea, fiber, shaping(p.rate_bps, border_buf)),
                              port(fiber, None, eb, line), p.index))
            links.append(pair("wan", port(fiber, None, wb, line),
                              port(wb, wa, fiber, shaping(p.rate_bps, border_buf)), p.index))
    links_t = tuple(links)
    routes = _routes(nodes, links_t)
    _override(spec, nodes, links_t, routes)
    return FabricPlan(name, spec, tuple(nodes), links_t, routes)


def _override(spec: FabricSpec, nodes: list[Node], links: tuple[Link, ...],
              routes: dict[str, tuple[Route, ...]]) -> None:
    """Apply the topology's static routes (``routes:``) over the computed ones, in place."""
    role = {n.name: n.role for n in nodes}
    for i, o in enumerate(spec.routes):
        where = f"routes[{i}]"
        for key in ("node", "to", "via"):
            if getattr(o, key) not in role:
                raise SpecError(spec.source, f"{where}.{key}", f"no node {getattr(o, key)!r} in this topology")
        if role[o.node] not in SWITCH_ROLES:
            raise SpecError(spec.source, f"{where}.node", f"{o.node} is a {role[o.node]}: only switches route")
        if role[o.to] != "leaf":
            raise SpecError(spec.source, f"{where}.to", f"{o.to} is a {role[o.to]}: name the leaf whose hosts it reaches")
        hop = next(((b.address, a.ifname) for link in links if link.kind in ("fabric", "border")
                    for a, b in ((link.a, link.b), (link.b, link.a)) if a.node == o.node and b.node == o.via), None)
        if hop is None:
            raise SpecError(spec.source, f"{where}.via", f"{o.via} is not a neighbour of {o.node}")
        subnet = next(l.a.address.network for l in links if l.kind == "host" and o.to in (l.a.node, l.b.node))
        table = list(routes[o.node])
        at = next((k for k, r in enumerate(table) if r.dst == subnet), None)
        if at is None:
            raise SpecError(spec.source, f"{where}.to", f"{o.node} is {o.to} itself, or has no route to it")
        table[at] = Route(subnet, ((str(hop[0].ip), hop[1]),))
        routes[o.node] = tuple(table)


def delay_line(spec: FabricSpec, path: WanPath) -> DelayLine:
    delay = spec.emulated_time(path.delay_s)
    limit = max(1000, math.ceil(NETEM_BDP_FACTOR * wan_bdp_bytes(spec, path) / MIN_FRAME))
    return DelayLine(delay, path.loss, path.corruption, limit, path.index)


def wan_bdp_bytes(spec: FabricSpec, path: WanPath) -> float:
    """Emulated bytes in flight on one direction of a long-haul path at its line rate: the
    emulated rate times the dilated delay (the real BDP x scale*dilation)."""
    return spec.emulated_rate(path.rate_bps) / 8 * spec.emulated_time(path.delay_s)


def bdp_packets(spec: FabricSpec, path: WanPath) -> float:
    """The path's one-way bandwidth-delay product in full-size frames."""
    return wan_bdp_bytes(spec, path) / (spec.mtu + ETH_HEADER)


def _routes(nodes: list[Node], links: tuple[Link, ...]) -> dict[str, tuple[Route, ...]]:
    """Shortest-path ECMP routes for every router to every subnet it is not attached to.

    Hosts get a single default route via their leaf. Fibers are bridges: a border-fiber-border
    pair is one router adjacency between the two borders.
    """
    role = {n.name: n.role for n in nodes}
    routers = [n.name for n in nodes if n.role in ("leaf", "spine", "border")]
    adj: dict[str, list[tuple[str, str, str]]] = {r: [] for r in routers}  # (nbr, ifname, nbr ip)
    attached: dict[ipaddress.IPv4Network, set[str]] = {}
    fiber_ends: dict[str, list[Port]] = {}
    routes: dict[str, list[Route]] = {n.name: [] for n in nodes}
    for link in links:
        if link.kind == "host":
            host, leaf = (link.a, link.b) if role[link.a.node] == "host" else (link.b, link.a)
            attached.setdefault(host.address.network, set()).add(leaf.node)
            routes[leaf.node].append(Route(ipaddress.IPv4Network(f"{host.address.ip}/32"), (("", leaf.ifname),)))
            routes[host.node].append(Route(ipaddress.IPv4Network("0.0.0.0/0"), ((str(leaf.address.ip), host.ifname),)))
            continue
        for p in (link.a, link.b):
            if p.address is not None:
                attached.setdefault(p.address.network, set()).add(p.node)
        if link.a.node in adj and link.b.node in adj:
            adj[link.a.node].append((link.b.node, link.a.ifname, str(link.b.address.ip)))
            adj[link.b.node].append((link.a.node, link.b.ifname, str(link.a.address.ip)))
        for p, q in ((link.a, link.b), (link.b, link.a)):
            if role[q.node] == "fiber" and p.address is not None:
                fiber_ends.setdefault(q.node, []).append(p)
    for ends in fiber_ends.values():
        a, b = ends
        adj[a.node].append((b.node, a.ifname, str(b.address.ip)))
        adj[b.node].append((a.node, b.ifname, str(a.address.ip)))

    for dst, sources in sorted(attached.items(), key=lambda kv: int(kv[0].network_address)):
        dist = {s: 0 for s in sources}
        queue = deque(sources)
        while queue:
            r = queue.popleft()
            for nbr, _, _ in adj[r]:
                if nbr not in dist:
                    dist[nbr] = dist[r] + 1
                    queue.append(nbr)
        for r in routers:
            if r in sources or r not in dist:
                continue
            hops = sorted({(ip, ifname) for nbr, ifname, ip in adj[r] if dist.get(nbr) == dist[r] - 1})
            routes[r].append(Route(dst, tuple(hops)))
    return {k: tuple(v) for k, v in routes.items()}
