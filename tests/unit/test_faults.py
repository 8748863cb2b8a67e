"""What a fault takes down and the ECMP groups left once the control plane noticed
(emulator/faults/routing.py), and the faults' text, on the shipped cross-DC plan."""
from __future__ import annotations

from pathlib import Path

import pytest

from emulator.cli.text import format_faults
from emulator.errors import UsageError
from emulator.faults import routing
from emulator.model import plan as plan_mod, spec
from emulator.model.timemodel import TimeModel

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def plan():
    return plan_mod.build(spec.load(REPO / "topologies" / "cross-dc.yaml"), "x")


def names(ports) -> list[str]:
    return sorted(f"{p.node}:{p.ifname}" for p in ports)


def test_a_fiber_cut_takes_down_both_borders_ports_onto_that_fiber(plan):
    dead = routing.dead_ports(plan, "fiber-cut", "wan3")
    assert [p.split(":")[0] for p in names(dead)] == ["east-border0", "west-border0"]
    assert all(plan.peer(p).node == "wan3" for p in dead)
    with pytest.raises(UsageError, match="wan0, wan1"):
        routing.dead_ports(plan, "fiber-cut", "wan8")


def test_withdrawing_a_cut_path_leaves_seven_next_hops_to_the_other_dc(plan):
    every = routing.ecmp_groups(plan, set())
    dead = set(names(routing.dead_ports(plan, "fiber-cut", "wan3")))
    left = routing.ecmp_groups(plan, dead)
    changed = {k: v for k, v in left.items() if v != every[k]}
    border = {p.ifindex for p in routing.dead_ports(plan, "fiber-cut", "wan3")}
    assert changed and all(len(v) == 7 and not set(v) & border for v in changed.values())
    assert all(len(every[k]) == 8 for k in changed)
    assert {plan.nodes[[n.uid for n in plan.nodes].index(uid)].name for uid, _ in changed} == \
        {"east-border0", "west-border0"}


def test_a_failed_spine_is_withdrawn_by_its_neighbours_and_no_group_is_left_empty(plan):
    dead = set(names(routing.dead_ports(plan, "switch-failure", "east-spine1")))
    every, left = routing.ecmp_groups(plan, set()), routing.ecmp_groups(plan, dead)
    spine1 = {p.ifindex for p in plan.ports("east-spine1")}
    by_uid = {n.uid: n.name for n in plan.nodes}
    for key, hops in left.items():
        assert hops, key
        if by_uid[key[0]] != "east-spine1" and len(every[key]) > 1:
            # no neighbour still sends towards the failed spine where it has another way
            assert not any(plan.next_hop(p).node == "east-spine1" for p in plan.ports(by_uid[key[0]])
                           if p.ifindex in hops), (by_uid[key[0]], key[1])
    assert any(set(every[k]) - set(left[k]) for k in every)
    assert spine1


def test_a_flap_takes_down_the_switch_ends_of_the_link(plan):
    up = next(p for p in plan.ports("east-leaf0") if plan.next_hop(p).node.startswith("east-spine"))
    far = plan.next_hop(up)
    assert names(routing.dead_ports(plan, "link-flap", f"east-leaf0:{up.ifname}")) == \
        sorted([f"east-leaf0:{up.ifname}", f"{far.node}:{far.ifname}"])
    # A host's link: the leaf's end alone, which then neither sends to the host nor takes in from it.
    down = next(p for p in plan.ports("east-leaf0") if plan.next_hop(p).node.startswith("east-host"))
    assert names(routing.dead_ports(plan, "link-flap", f"east-leaf0:{down.ifname}")) == [f"east-leaf0:{down.ifname}"]


def test_a_cut_takes_the_fiber_down_with_the_borders_and_a_switch_failure_no_fiber(plan):
    assert names(routing.medium_ports(plan, "fiber-cut", "wan3")) == names(plan.ports("wan3"))
    border = routing.dead_ports(plan, "fiber-cut", "wan3")[0]
    assert names(routing.medium_ports(plan, "link-flap", f"{border.node}:{border.ifname}")) == \
        names(plan.ports("wan3"))
    up = next(p for p in plan.ports("east-leaf0") if plan.next_hop(p).node.startswith("east-spine"))
    assert routing.medium_ports(plan, "link-flap", f"east-leaf0:{up.ifname}") == []
    assert routing.medium_ports(plan, "switch-failure", "east-spine1") == []


def test_a_ports_share_follows_its_groups(plan):
    every = routing.ecmp_groups(plan, set())
    wan = routing.dead_ports(plan, "fiber-cut", "wan3")
    b = next(p for p in wan if p.node == "east-border0")
    keys = routing.serving(every, b.ifindex, plan.node("east-border0").uid)
    assert keys and routing.share(every, b.ifindex, keys) == pytest.approx(1 / 8)
    cut = routing.ecmp_groups(plan, set(names(wan)))
    assert routing.share(cut, b.ifindex, keys) == 0.0
    other = cut[keys[0]][0]
    assert routing.share(cut, other, keys) == pytest.approx(1 / 7)
    weighted = {k: routing.weighted_slots(v, {b.ifindex: 3.0}, 64) for k, v in every.items()}
    assert routing.share(weighted, b.ifindex, keys) == pytest.approx(3 / 10, abs=1 / 64)


def test_the_faults_text_gives_each_timeline_in_real_time():
    tm = TimeModel.of(1e-3, 1000).as_dict()
    body = {"time_model": tm, "down": [], "withdrawn": [], "errors": [], "faults": [
        {"id": 1, "kind": "fiber-cut", "target": "wan3", "ports": ["east-border0:eth5", "west-border0:eth5"],
         "asked_at": 10.0, "took_effect_at": 10.001, "converged_at": 160.001, "restored_at": 400.0,
         "reconverged_at": None}]}
    text = "\n".join(format_faults(body))
    assert "fiber-cut" in text and "+1us" in text and "+150ms" in text and "+390ms" in text
    assert "withdrawn from ECMP: none" in text
    assert format_faults({**body, "faults": []}) == ["no faults applied"]
