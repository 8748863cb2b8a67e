"""What a fault takes down, and the ECMP groups the control plane leaves once it noticed.

Pure: functions of the fabric's plan. A fault marks switch ports down (the datapath then sends
and takes in nothing by them); after the detection delay (BFD-like) every switch withdraws the
next hops that lead through a dead port from its ECMP groups, and restores them the same way.
"""
from __future__ import annotations

import ipaddress

from emulator.errors import UsageError
from emulator.model.plan import FabricPlan, Port, SWITCH_ROLES


def _switch_port(plan: FabricPlan, port: Port) -> bool:
    return plan.node(port.node).role in SWITCH_ROLES


def dead_ports(plan: FabricPlan, kind: str, target: str) -> list[Port]:
    """The switch ports ``kind`` on ``target`` takes down.

    - ``fiber-cut`` and ``link-flap`` on a path (``wan3``): both borders' ports onto its fiber;
    - ``link-flap`` on a port (``node:ifname``): that port and the one at its far end;
    - ``switch-failure`` on a switch: every port it has.
    """
    if kind in ("fiber-cut", "link-flap") and ":" not in target:
        try:
            fiber = plan.node(target)
        except KeyError:
            fiber = None
        if fiber is None or fiber.role != "fiber":
            paths = ", ".join(n.name for n in plan.nodes if n.role == "fiber") or "none"
            raise UsageError(f"{kind}: {target!r} is not a long-haul path of fabric {plan.name!r} (its paths: {paths})")
        return [plan.peer(p) for p in plan.ports(target)]
    if kind == "link-flap":
        node, _, ifname = target.partition(":")
        try:
            port = plan.port(node, ifname)
        except KeyError:
            raise UsageError(f"link-flap: no port {target!r} in fabric {plan.name!r}") from None
        ends = [port, plan.next_hop(port)]
        return [p for p in ends if _switch_port(plan, p)]
    if kind == "switch-failure":
        try:
            role = plan.node(target).role
        except KeyError:
            role = None
        if role not in SWITCH_ROLES:
            switches = ", ".join(n.name for n in plan.nodes if n.role in SWITCH_ROLES)
            raise UsageError(f"switch-failure: {target!r} is not a switch of fabric {plan.name!r} ({switches})")
        return list(plan.ports(target))
    raise UsageError(f"{kind} does not take ports down")


def medium_ports(plan: FabricPlan, kind: str, target: str) -> list[Port]:
    """The long-haul fiber's own ports a fault on a path (or on a port onto one) takes down with
    the borders': what was in flight on a cut fiber, or still queued for it, is lost there.
    None for a switch failure (its links are whole) or a flap between switches."""
    if kind not in ("fiber-cut", "link-flap"):
        return []
    if ":" not in target:
        return list(plan.ports(target))
    node, _, ifname = target.partition(":")
    peer = plan.peer(plan.port(node, ifname))
    return list(plan.ports(peer.node)) if plan.node(peer.node).role == "fiber" else []


def ecmp_groups(plan: FabricPlan, down: set[str]) -> dict[tuple[int, ipaddress.IPv4Network], list[int]]:
    """Every switch's ECMP group (node uid, destination) -> the ifindexes it uses, without the
    next hops that lead through a port in ``down`` ("node:ifname"): its own port is dead, or
    the next IP node's port behind it is. A group that would be left empty keeps its next hops
    (nothing else reaches that destination; what is sent into a dead port is lost there)."""
    out = {}
    for node in plan.nodes:
        if node.role not in SWITCH_ROLES:
            continue
        ports = {p.ifname: p for p in plan.ports(node.name)}
        for route in plan.routes[node.name]:
            every = [ports[dev] for _, dev in route.nexthops]
            live = [p for p in every if f"{p.node}:{p.ifname}" not in down
                    and f"{plan.next_hop(p).node}:{plan.next_hop(p).ifname}" not in down]
            out[(node.uid, route.dst)] = [p.ifindex for p in (live or every)]
    return out


def weighted_slots(ifindexes: list[int], weights: dict[int, float], slots: int) -> list[int]:
    """An ECMP group as ``slots`` table entries, each port filling a share of them by its
    weight (largest remainder; a port of weight 0 gets none). All weights 1 (or none given):
    the group as it is, one slot a port. All weights 0: the group as it is too (nothing else
    reaches the destination)."""
    w = [max(0.0, weights.get(i, 1.0)) for i in ifindexes]
    if all(x == 1.0 for x in w) or not sum(w):
        return list(ifindexes)
    total = sum(w)
    exact = [x * slots / total for x in w]
    counts = [int(e) for e in exact]
    for k in sorted(range(len(w)), key=lambda k: counts[k] - exact[k])[:slots - sum(counts)]:
        counts[k] += 1
    # Interleaved, so that a hash's neighbours spread over the ports.
    out, left = [], list(counts)
    while any(left):
        for k, i in enumerate(ifindexes):
            if left[k]:
                out.append(i)
                left[k] -= 1
    return out


def serving(full: dict, ifindex: int, node_uid: int) -> list:
    """The groups of ``node_uid`` that hold ``ifindex`` with nothing down (``full``): the
    destinations it serves, whose share of them ``share`` reads."""
    return [key for key, group in full.items() if key[0] == node_uid and ifindex in group]


def share(now: dict, ifindex: int, keys: list) -> float:
    """The share of the traffic to the destinations of ``keys`` that the ECMP groups give
    ``ifindex`` now: the mean over those groups of its slots over the group's (0 once withdrawn)."""
    if not keys:
        return 0.0
    return sum(now[k].count(ifindex) / len(now[k]) for k in keys if now.get(k)) / len(keys)
