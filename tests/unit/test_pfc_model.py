"""PFC's figures: headroom computed from rate, cable, MTU and the emulator's reaction; what `up`
refuses, with the figure; the PAUSE frame on the wire as scapy decodes it."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from scapy.contrib.mac_control import MACControlClassBasedFlowControl
from scapy.layers.l2 import Ether

from emulator.bpf import pfc as agent
from emulator.errors import SpecError
from emulator.model import pfc, plan, spec, units

TOPOLOGIES = Path(__file__).resolve().parents[2] / "topologies"


def incast(**changes) -> dict:
    doc = yaml.safe_load((TOPOLOGIES / "pfc-incast.yaml").read_text())
    for path, value in changes.items():
        node = doc
        keys = path.split(".")
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = value
    return doc


def parse(doc: dict):
    return spec.parse(yaml.safe_dump(doc), "t.yaml")


def test_headroom_is_frames_cable_and_reaction():
    s = parse(incast())
    h = pfc.headroom(s, "host")
    rate = 400e9 / 8
    assert h.frames == pfc.FRAMES_IN_FLIGHT * (4200 + 14)
    assert h.cable == round(2 * rate * units.fiber_delay(20))  # 20 m, both ways: 10 KB at 400G
    # The switch's 500 ns plus the emulator's reaction in real time: wall / dilation (4000).
    assert h.response_s == pytest.approx(500e-9 + pfc.EMULATOR_REACTION_S / 4000)
    assert h.response == round(rate * h.response_s)
    assert h.total == h.frames + h.cable + h.response
    # Four times the rate, four times the bytes on the cable and in the reaction.
    f = pfc.headroom(s, "fabric")
    assert f.cable == pytest.approx(4 * h.cable, abs=1) and f.response == pytest.approx(4 * h.response, abs=2)


def test_a_reserved_headroom_below_the_need_is_refused_with_the_figure():
    need = pfc.headroom(parse(incast()), "fabric").total
    with pytest.raises(SpecError) as e:
        parse(incast(**{"pfc.headroom": "100KB"}))
    assert "pfc.headroom" in str(e.value) and units.format_size(need) in str(e.value)
    assert parse(incast(**{"pfc.headroom": "8MB"})).pfc.headroom == 8_000_000


def test_pfc_across_the_long_haul_is_refused_with_rate_times_rtt():
    doc = yaml.safe_load((TOPOLOGIES / "cross-dc.yaml").read_text())
    doc["pfc"] = {"enabled": True, "long_haul": True}
    doc["dilation"] = "faithful"
    with pytest.raises(SpecError) as e:
        parse(doc)
    msg = str(e.value)
    assert "pfc.long_haul" in msg and "30ms" in msg.replace(" ", "") and "1.5GB" in msg.replace(" ", ""), msg


def test_a_reaction_the_buffer_cannot_hold_is_refused():
    # At dilation 10 the emulator's 100 ms of reaction is 10 ms of the real fabric: 500 MB at 400G.
    with pytest.raises(SpecError) as e:
        parse(incast(dilation=400, scale=0.0025))
    assert "pfc.xoff" in str(e.value) and "dilation: faithful" in str(e.value)


def test_pfc_needs_htb():
    with pytest.raises(SpecError) as e:
        parse(incast(shaper="tbf"))
    assert "shaper" in str(e.value) and "htb" in str(e.value)


def test_every_link_but_the_long_haul_runs_pfc():
    doc = yaml.safe_load((TOPOLOGIES / "cross-dc.yaml").read_text())
    doc["pfc"] = {"enabled": True}
    doc["dilation"] = "faithful"
    p = plan.build(parse(doc), "x")
    kinds = {link.kind: plan_pfc for link in p.links for plan_pfc in [p.pfc_port(link.a)]}
    assert kinds == {"host": True, "fabric": True, "border": True, "wan": False}
    assert all(port.egress.priorities for port in p.ports() if isinstance(port.egress, plan.Shaping))


def test_a_pause_quantum_is_512_bit_times_dilated():
    s = parse(incast())
    assert pfc.quantum_s(s, "host") == pytest.approx(512 / 400e9 * 4000)
    # At faithful (d = 1/s) that is 512 bit times of the emulated 100 Mb/s.
    assert pfc.quantum_s(s, "host") == pytest.approx(512 / 100e6)


def test_the_pause_frame_decodes_as_pfc():
    frame = agent.pfc_frame(bytes.fromhex("026270000309"), 1 << 3, {3: 0xFFFF})
    assert len(frame) == 60
    pkt = Ether(frame)
    assert pkt.dst == "01:80:c2:00:00:01" and pkt.type == 0x8808
    cbfc = pkt[MACControlClassBasedFlowControl]
    assert cbfc._op_code == 0x0101
    assert cbfc.c3_enabled == 1 and cbfc.c3_pause_time == 0xFFFF
    assert cbfc.c0_enabled == 0 and cbfc.c0_pause_time == 0


def test_static_routes_replace_the_computed_ones():
    p = plan.build(spec.load(TOPOLOGIES / "deadlock.yaml"), "x")
    leaf2 = next(r for r in p.routes["dc-spine0"] if str(r.dst) == "198.18.2.0/24")
    via = p.link_between("dc-spine0", "dc-leaf1")[0]
    assert leaf2.nexthops == ((str(p.peer(via).address.ip), via.ifname),)


@pytest.mark.parametrize("key,value,why", [
    ("node", "dc-leaf9", "no node"),
    ("via", "dc-spine1", "not a neighbour"),
    ("to", "dc-spine1", "name the leaf"),
    ("node", "dc-host0", "only switches route"),
])
def test_a_bad_static_route_names_its_key(key, value, why):
    doc = yaml.safe_load((TOPOLOGIES / "deadlock.yaml").read_text())
    doc["routes"][1][key] = value
    with pytest.raises(SpecError) as e:
        plan.build(parse(doc), "x")
    assert f"routes[1].{key}" in str(e.value) and why in str(e.value)


def test_tagger_needs_a_second_lossless_priority():
    s = parse(incast(**{"pfc.deadlock_avoidance": "tagger"}))
    assert s.pfc.lossless == (3, 4)
    with pytest.raises(SpecError) as e:
        parse(incast(**{"pfc.deadlock_avoidance": "tagger", "pfc.tagger_priority": 3}))
    assert "pfc.tagger_priority" in str(e.value)
    with pytest.raises(SpecError) as e:
        parse(incast(**{"pfc.tagger_priority": 6}))
    assert "CNPs" in str(e.value)
