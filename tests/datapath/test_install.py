"""What user space writes into the maps before any packet: the switches' ECN thresholds come
from the topology's ecn section, else the NIC's DCQCN profile, else the paper's, scaled."""
from __future__ import annotations

import ctypes as ct

import pytest

from emulator.bpf import install, structs as S
from emulator.errors import FabricError
from emulator.model import spec

BASE = """version: 1
scale: 0.001
datacenters: [{name: east, spines: 1, leaves: 1, hosts_per_leaf: 2}]
"""


def _config(dp):
    c = dp.bpf["bp_config"][ct.c_int(0)]
    return c.hash_mode, c.kmin, c.kmax, c.pmax


@pytest.mark.parametrize("extra,expected", [
    ("nic: {dcqcn: hpcc-ns3}", (1600, 6400, 0.2)),  # 100/400 KB per 25G at 400G, scaled
    ("nic: {dcqcn: hpcc-ns3}\necn: {kmax: 8MB}", (1600, 8000, 0.2)),
    ("nic: {dcqcn: {profile: paper, kmin: 20KB, pmax: 5%}}", (20, 200, 0.05)),
    ("nic: {dcqcn: nvidia}", (5, 200, 0.01)),  # nvidia leaves them to the switch: the paper's
])
def test_thresholds_reach_the_map(dp, extra, expected):
    before = _config(dp)
    try:
        install.config(dp, spec.parse(BASE + extra))
        mode, kmin, kmax, pmax = _config(dp)
        assert (mode, kmin, kmax) == (S.HASH_MODES["five-tuple"], *expected[:2])
        assert pmax == round(expected[2] * S.PROB_ONE)
    finally:
        c = S.Config(*before)
        dp.bpf["bp_config"][ct.c_int(0)] = c


@pytest.mark.parametrize("shaper", ["htb", "tbf"])
def test_port_entry_carries_the_rate_of_the_queue_it_sees_drain(shaper):
    """A port times the dequeues of its peer's egress against that egress's emulated rate, in
    bytes/s; where no shaped switch queue drains into it (a switch's peer is a host) it times
    nothing."""
    from emulator.model import plan

    p = plan.build(spec.parse(BASE + f"shaper: {shaper}\n"), "tpace")
    timed = 0
    for port in p.ports():
        entry = install.port_entry(p, port)
        peer = p.peer(port)
        if p.node(peer.node).role in plan.SWITCH_ROLES:
            assert entry.peer_queue == peer.ifindex and entry.peer_rate == peer.egress.rate_bps // 8 > 0
            assert bool(entry.flags & S.PORT_PEER_TBF) == (shaper == "tbf")
            timed += 1
        else:
            assert entry.peer_queue == 0 and entry.peer_rate == 0 and not entry.flags & S.PORT_PEER_TBF
    assert timed > 0


def test_the_hash_mode_and_the_ecn_thresholds_are_set_apart(dp):
    before = _config(dp)
    try:
        dp.set_hash("five-tuple")
        dp.set_ecn(1000, 5000, 0.5)
        dp.set_hash("qpn-psn")  # as `backplane set-hash` does on a running fabric
        assert _config(dp) == (S.HASH_MODES["qpn-psn"], 1000, 5000, S.PROB_ONE // 2)
        dp.set_ecn(2000, 3000, 0.25)
        assert _config(dp) == (S.HASH_MODES["qpn-psn"], 2000, 3000, S.PROB_ONE // 4)
        with pytest.raises(FabricError, match="kmin 3000 and kmax 2000"):
            dp.set_ecn(3000, 2000, 0.25)
        assert _config(dp)[1:3] == (2000, 3000)
    finally:
        dp.bpf["bp_config"][ct.c_int(0)] = S.Config(*before)
