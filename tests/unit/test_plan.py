"""The pure fabric plan: names, addresses, queues and routes, checked without root."""
import ipaddress
import itertools
from pathlib import Path

import pytest

from emulator.errors import BackplaneError
from emulator.model import plan, spec

TOPOLOGIES = Path(__file__).resolve().parents[2] / "topologies"


@pytest.fixture(scope="module", params=["cross-dc", "single-dc", "tiny"])
def fabric_plan(request):
    return plan.build(spec.load(TOPOLOGIES / f"{request.param}.yaml"), "t1")


def test_plan_is_deterministic():
    s = spec.load(TOPOLOGIES / "cross-dc.yaml")
    assert plan.build(s, "a") == plan.build(s, "a")


def test_default_fabric_counts():
    p = plan.build(spec.load(TOPOLOGIES / "cross-dc.yaml"))
    roles = [n.role for n in p.nodes]
    assert (roles.count("host"), roles.count("leaf"), roles.count("spine"), roles.count("border"),
            roles.count("fiber")) == (8, 4, 4, 2, 8)
    # 8 host links, 8 leaf-spine, 4 spine-border, 2 halves of each of 8 long-haul paths
    assert len(p.links) == 8 + 8 + 4 + 16


def test_every_name_carries_the_prefix(fabric_plan):
    for n in fabric_plan.nodes:
        assert fabric_plan.netns(n.name).startswith("bp-t1-")


def test_interface_names_fit_the_kernel_and_macs_are_unique(fabric_plan):
    ports = list(fabric_plan.ports())
    assert all(len(p.ifname) <= 15 for p in ports)
    macs = [p.mac for p in ports]
    assert len(set(macs)) == len(macs)
    assert all(int(m.split(":")[0], 16) & 0x02 for m in macs)  # locally administered


def test_addresses_are_unique_and_in_their_pools(fabric_plan):
    a = fabric_plan.spec.addressing
    seen = {}
    for p in fabric_plan.ports():
        if p.address is None:
            assert fabric_plan.node(p.node).role == "fiber"
            continue
        assert p.address.ip in a.hosts or p.address.ip in a.links
        if fabric_plan.node(p.node).role == "leaf" and p.address.network.prefixlen == 32:
            continue  # a leaf's gateway address is on each of its host ports
        assert p.address.ip not in seen, (p, seen.get(p.address.ip))
        seen[p.address.ip] = p


def test_one_host_subnet_per_leaf(fabric_plan):
    subnets = {}
    for p in fabric_plan.ports():
        if fabric_plan.node(p.node).role == "host":
            subnets.setdefault(p.peer_node, set()).add(p.address.network)
    assert all(len(s) == 1 for s in subnets.values())
    assert len({next(iter(s)) for s in subnets.values()}) == len(subnets)


def test_shaped_egress_everywhere_but_the_fiber(fabric_plan):
    s = fabric_plan.spec
    for link in fabric_plan.links:
        for p in (link.a, link.b):
            if fabric_plan.node(p.node).role == "fiber":
                assert isinstance(p.egress, plan.DelayLine)
            else:
                assert isinstance(p.egress, plan.Shaping)
                assert p.egress.rate_bps == s.emulated_rate(p.egress.real_rate_bps)
                assert p.egress.buffer_bytes == s.emulated_size(p.egress.real_buffer_bytes)


def test_netem_limit_holds_one_and_a_half_bdp_in_minimum_frames():
    s = spec.load(TOPOLOGIES / "cross-dc.yaml")
    for path in s.wan_paths:
        line = plan.delay_line(s, path)
        assert line.delay_s == pytest.approx(0.015)
        bdp_bytes = s.emulated_rate(path.rate_bps) / 8 * path.delay_s
        assert line.limit_packets * plan.MIN_FRAME >= 1.5 * bdp_bytes
        assert line.limit_packets >= 1.5 * plan.bdp_packets(s, path)


def _forward(p: plan.FabricPlan, src: str, dst_ip: ipaddress.IPv4Address) -> list[list[str]]:
    """Every path a packet can take from ``src`` to ``dst_ip`` following the planned tables."""
    owner = {}
    for port in p.ports():
        if port.address is not None and not (p.node(port.node).role == "leaf" and port.address.network.prefixlen == 32):
            owner[port.address.ip] = port.node
    by_if = {(port.node, port.ifname): port for port in p.ports()}
    paths, stack = [], [[src]]
    while stack:
        trail = stack.pop()
        node = trail[-1]
        if owner.get(dst_ip) == node:
            paths.append(trail)
            continue
        assert len(trail) < 12, f"loop: {trail}"
        connected = [port for port in p.ports(node) if port.address is not None
                     and port.address.network.prefixlen < 32 and dst_ip in port.address.network]
        if connected:
            hops = [(str(dst_ip), connected[0].ifname)]
        else:
            routes = [r for r in p.routes[node] if dst_ip in r.dst]
            assert routes, f"{node} has no route to {dst_ip}"
            hops = max(routes, key=lambda r: r.dst.prefixlen).nexthops
        for gw, ifname in hops:
            port = by_if[(node, ifname)]
            nxt = port.peer_node
            if p.node(nxt).role == "fiber":  # a bridge: straight through to the far border
                far = [q for q in p.ports(nxt) if q.ifname != port.peer_ifname][0]
                nxt = far.peer_node
            stack.append(trail + [nxt])
    return paths


def test_every_host_reaches_every_host_on_shortest_paths(fabric_plan):
    hosts = [n.name for n in fabric_plan.nodes if n.role == "host"]
    for a, b in itertools.permutations(hosts, 2):
        paths = _forward(fabric_plan, a, fabric_plan.host_address(b))
        assert paths and all(path[-1] == b for path in paths)
        assert len({len(path) for path in paths}) == 1  # equal cost only


def test_cross_dc_ecmp_uses_every_long_haul_path():
    p = plan.build(spec.load(TOPOLOGIES / "cross-dc.yaml"))
    paths = _forward(p, "east-host0", p.host_address("west-host0"))
    # 2 spines up in east x 8 fibers x 2 spines down in west
    assert len(paths) == 2 * 8 * 2
    route = [r for r in p.routes["east-border0"] if p.host_address("west-host0") in r.dst][0]
    assert len(route.nexthops) == 8


def test_every_interface_address_is_reachable_from_hosts():
    p = plan.build(spec.load(TOPOLOGIES / "tiny.yaml"))
    for port in p.ports():
        if port.address is not None and port.address.network.prefixlen < 32:
            assert _forward(p, "east-host0", port.address.ip)


@pytest.mark.parametrize("bad", ["", "Main", "a-b", "x" * 13, "probe"])
def test_fabric_names_are_checked(bad):
    with pytest.raises(BackplaneError):
        plan.prefix_of(bad)


def test_ports_have_unique_ifindexes_and_switch_queues_hold_more_than_their_buffer():
    """The eBPF maps key ports by ifindex across all namespaces; the qdisc must never drop
    before the egress program's tail drop at the buffer."""
    from emulator.model.plan import Shaping, SWITCH_ROLES

    s = spec.load(TOPOLOGIES / "cross-dc.yaml")
    p = plan.build(s, "t")
    indexes = [port.ifindex for port in p.ports()]
    assert len(set(indexes)) == len(indexes) and min(indexes) >= plan.FIRST_IFINDEX
    for port in p.ports():
        if isinstance(port.egress, Shaping):
            if p.node(port.node).role in SWITCH_ROLES:
                assert port.egress.qdisc_limit > port.egress.buffer_bytes
            else:
                assert port.egress.qdisc_limit == port.egress.buffer_bytes
    wan = next(l for l in p.links if l.kind == "wan")
    border = wan.a if p.node(wan.a.node).role == "border" else wan.b
    # The next IP hop of a border's long-haul port is the other border, across the fiber's bridge.
    assert p.node(p.next_hop(border).node).role == "border" and p.next_hop(border).node != border.node


def test_hash_reference_spreads_and_is_deterministic():
    from emulator.bpf import hashref

    f = dict(saddr="198.18.0.2", daddr="198.18.4.2", proto=17, sport=49152, dport=4791, psn=0)
    picks = [hashref.next_hop("qpn", 5, 8, dqpn=q, **f) for q in range(256, 256 + 64)]
    assert picks == [hashref.next_hop("qpn", 5, 8, dqpn=q, **f) for q in range(256, 256 + 64)]
    assert len(set(picks)) == 8
    # five-tuple ignores the QPN: one flow, one path.
    assert len({hashref.next_hop("five-tuple", 5, 8, dqpn=q, **f) for q in range(256, 320)}) == 1


def test_dilation_stretches_delay_lines_and_their_queues():
    s = spec.with_dilation(spec.load(TOPOLOGIES / "cross-dc.yaml"), 10)
    for path in s.wan_paths:
        line = plan.delay_line(s, path)
        assert line.delay_s == pytest.approx(0.15)  # 15 ms x 10 of wall time
        # The queue holds the dilated BDP: 10x the bytes in flight at the same emulated rate.
        assert line.limit_packets * plan.MIN_FRAME >= 1.5 * s.emulated_rate(path.rate_bps) / 8 * 0.15
    p = plan.build(s, "t")
    assert p.wan_delay_s() == pytest.approx(0.15)
    for port in p.ports():
        if isinstance(port.egress, plan.Shaping):
            assert port.egress.buffer_bytes == round(port.egress.real_buffer_bytes * 0.001 * 10)


def test_hosts_egress_carries_the_dilated_in_dc_latency():
    s = spec.with_dilation(spec.load(TOPOLOGIES / "single-dc.yaml"), "faithful")
    p = plan.build(s, "t")
    one_way = s.intra_dc_one_way_s()
    assert 1e-6 < one_way < 10e-6  # cables and switches: microseconds
    for port in p.ports():
        role = p.node(port.node).role
        if role == "host":
            assert port.egress.delay_s == pytest.approx(one_way * 1000)
            assert port.egress.delay_limit_packets * plan.MIN_FRAME >= port.egress.buffer_bytes
        elif isinstance(port.egress, plan.Shaping):
            assert port.egress.delay_s == 0  # switch queues stay FIFOs: their depth is exact
    assert p.intra_delay_applies(True) and not p.intra_delay_applies(False)
    # At realtime the same latency is below what the emulator's own forwarding costs.
    assert not plan.build(spec.load(TOPOLOGIES / "single-dc.yaml"), "t").intra_delay_applies(True)


def test_a_dilation_whose_wan_does_not_fit_in_memory_is_refused_with_the_one_that_fits():
    from emulator.errors import CapabilityError
    from emulator.fabric.checks import check_wan_memory

    faithful = plan.build(spec.with_dilation(spec.load(TOPOLOGIES / "cross-dc.yaml"), "faithful"), "t")
    # 8 paths x 2 ways x 400 Mb/s x 15 s = 12 GB in flight: not in 24 GB with its overhead.
    with pytest.raises(CapabilityError) as info:
        check_wan_memory(faithful, 24 * 10**9)
    text = str(info.value)
    assert "12 GB in flight" in text and "15 s" in text and "lower the dilation to" in text
    fit = float(text.split("lower the dilation to ")[1].split()[0])
    assert 100 < fit < 1000
    check_wan_memory(plan.build(spec.with_dilation(faithful.spec, fit * 0.99), "t"), 24 * 10**9)  # that fits
    check_wan_memory(plan.build(spec.load(TOPOLOGIES / "cross-dc.yaml"), "t"), 24 * 10**9)  # realtime fits


def test_link_between_finds_neighbours_and_long_haul_paths_and_names_what_is_wrong():
    p = plan.build(spec.load(TOPOLOGIES / "cross-dc.yaml"))
    port, peer, fiber = p.link_between("east-host0", "east-leaf0")
    assert (port.node, peer.node, fiber) == ("east-host0", "east-leaf0", None)
    port, peer, fiber = p.link_between("east-border0", "west-border0", 3)
    assert (port.node, peer.node) == ("east-border0", "west-border0")
    assert fiber is not None and p.node(fiber.node).role == "fiber" and p.node(fiber.node).index == 3
    with pytest.raises(BackplaneError, match=r"no long-haul path 99 .*its paths: 0, 1, 2, 3, 4, 5, 6, 7"):
        p.link_between("east-border0", "west-border0", 99)
    with pytest.raises(BackplaneError, match="no node 'nowhere'"):
        p.link_between("east-host0", "nowhere")
    with pytest.raises(BackplaneError, match="are not neighbours"):
        p.link_between("east-host0", "west-host0")
