"""Program a fabric plan into a Datapath: ports, routes, hash mode, thresholds, attachments.

Everything here is computed from the plan (user space decides); the kernel programs only look
it up. Attach order matters for exact queue depth: the dequeue side (tc ingress on every port)
goes on before any egress hook starts counting what enters a queue.
"""
from __future__ import annotations

from typing import Mapping

from pyroute2 import IPRoute

from emulator.bpf import structs as S
from emulator.bpf.datapath import Datapath
from emulator.bpf.pfc import PfcAgent
from emulator.errors import FabricError
from emulator.fabric import netns, rtnl
from emulator.model.plan import FabricPlan, Port, Shaping, SWITCH_ROLES
from emulator.model import pfc as pfc_model
from emulator.model.spec import FabricSpec


# Tiers of the Clos, for Tagger's "up": a port towards a higher tier.
TIERS = {"leaf": 1, "spine": 2, "border": 3}


def port_entry(plan: FabricPlan, port: Port, loss_in_ebpf: bool = False) -> S.Port:
    """The port table's entry. With ``loss_in_ebpf`` (no netem delay lines), a border's port
    towards a fiber drops with that long-haul path's configured loss."""
    node = plan.node(port.node)
    peer = plan.peer(port)
    loss = 0.0
    if loss_in_ebpf and plan.node(peer.node).role == "fiber":
        loss = next(w.loss for w in plan.spec.wan_paths if w.index == plan.node(peer.node).index)
    switch = node.role in SWITCH_ROLES
    # The queue that drains into this port is the peer's egress, if the peer is a switch port.
    peer_queue = peer.ifindex if plan.node(peer.node).role in SWITCH_ROLES else 0
    buffer = port.egress.buffer_bytes if switch and isinstance(port.egress, Shaping) else 0
    # That queue's rate, so this port times its dequeues against it (0: not shaped, not timed).
    shaped = peer.egress if peer_queue and isinstance(peer.egress, Shaping) else None
    flags = (S.PORT_SWITCH if switch else 0) | (S.PORT_PEER_TBF if shaped and shaped.shaper == "tbf" else 0)
    headroom = 0
    if plan.pfc_port(port):
        flags |= S.PORT_PFC
        headroom = plan.spec.emulated_size(pfc_model.reserved(plan.spec, plan.link_of(port).kind))
    if isinstance(port.egress, Shaping) and port.egress.priorities:
        flags |= S.PORT_PRIO_QUEUES
    peer_role = plan.node(plan.next_hop(port).node).role
    if switch and peer_role in SWITCH_ROLES and TIERS[peer_role] > TIERS[node.role]:
        flags |= S.PORT_UP
    return S.Port(node.uid, flags, peer_queue, buffer, S.mac_bytes(port.mac),
                  S.mac_bytes(plan.next_hop(port).mac), min(0xFFFFFFFF, round(loss * 2**32)),
                  shaped.rate_bps // 8 if shaped else 0, headroom)


def config(datapath: Datapath, spec: FabricSpec) -> None:
    """The topology's hash mode and the ECN thresholds the switches mark with: the topology's
    ``ecn``, or its DCQCN profile's, or the paper's (spec.ecn has them resolved), scaled."""
    datapath.set_hash(spec.ecmp.hash)
    datapath.set_ecn(*spec.emulated_ecn())


def program(datapath: Datapath, plan: FabricPlan, loss_in_ebpf: bool = False) -> int:
    """Write the plan's ports, routes and settings into the maps; returns the routes written."""
    spec = plan.spec
    config(datapath, spec)
    if spec.ecmp.adaptive != "off":
        datapath.set_adaptive(True, round(spec.emulated_time(spec.flowlet_gap()) * 1e9))
    tagger = spec.pfc.tagger_priority if spec.pfc.enabled and spec.pfc.deadlock_avoidance == "tagger" else None
    datapath.set_dscp_prio(spec.pfc.priority, tagger)
    if spec.pfc.enabled:
        datapath.set_pfc(spec.pfc.lossless, spec.emulated_size(spec.pfc.xoff), spec.emulated_size(spec.pfc.xon),
                         tagger)
    for port in plan.ports():
        datapath.set_port(port.ifindex, port_entry(plan, port, loss_in_ebpf))
    need = sum(len(plan.routes[n.name]) for n in plan.nodes if n.role in SWITCH_ROLES)
    if need > S.MAX_ROUTES:
        raise FabricError(f"the switches of this fabric need {need} routes, and the datapath's route table "
                          f"holds {S.MAX_ROUTES} (BP_MAX_ROUTES, ebpf/include/bp_consts.h)")
    routes = 0
    for node in plan.nodes:
        if node.role not in SWITCH_ROLES:
            continue
        index = {p.ifname: p.ifindex for p in plan.ports(node.name)}
        for route in plan.routes[node.name]:
            datapath.set_route(node.uid, route.dst, [index[dev] for _, dev in route.nexthops])
            routes += 1
    return routes


def attach(datapath: Datapath, plan: FabricPlan) -> None:
    """Attach to every port: the ingress program everywhere first (dequeue side), then the
    egress program; one batch of requests per node and pass, each read back. The fabric checked
    every port's ifindex as it built them (FabricNode.check_ports)."""
    sockets = {}
    try:
        for node in plan.nodes:
            if any(True for _ in plan.ports(node.name)):
                with netns.entered(plan.netns(node.name)):
                    sockets[node.name] = rtnl.socket_here()
        for name, sock in sockets.items():
            datapath.attach_ingress_all(plan.netns(name), sock, {p.ifindex: p.ifname for p in plan.ports(name)})
        for name, sock in sockets.items():
            switch = plan.node(name).role in SWITCH_ROLES
            # A host's port gets the egress program only to put its packets in their priority's queue.
            egress = {p.ifindex: p.ifname for p in plan.ports(name)
                      if switch or (isinstance(p.egress, Shaping) and p.egress.priorities)}
            if egress:
                datapath.attach_egress_all(plan.netns(name), sock, egress)
    finally:
        for sock in sockets.values():
            sock.close()


def load(plan: FabricPlan, loss_in_ebpf: bool) -> Datapath:
    """Compile and load the programs and write the plan into their maps: none of it needs the
    fabric, so the fabric runs it beside its own build (about a second of compiler). On any
    failure free what was loaded."""
    datapath = Datapath()
    try:
        program(datapath, plan, loss_in_ebpf=loss_in_ebpf)
    except BaseException:
        datapath.close()
        raise
    return datapath


def finish(datapath: Datapath, plan: FabricPlan, iproutes: Mapping[str, IPRoute]) -> None:
    """Attach a loaded datapath to every port of the built fabric, and start its PFC agent.
    ``iproutes``: the nodes' netlink sockets (the builder's protocol; attaching uses bare ones)."""
    attach(datapath, plan)
    if plan.spec.pfc.enabled:
        datapath.pfc = PfcAgent(datapath.bpf, plan)


def build(plan: FabricPlan, iproutes: Mapping[str, IPRoute], loss_in_ebpf: bool) -> Datapath:
    """load() then finish(), in one go; on any failure free what was loaded."""
    datapath = load(plan, loss_in_ebpf)
    try:
        finish(datapath, plan, iproutes)
    except BaseException:
        datapath.close()
        raise
    return datapath
