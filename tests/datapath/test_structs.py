"""The Python mirror of the C structs agrees with bcc's view of the compiled program."""
from __future__ import annotations

import ctypes as ct
import struct

import pytest

from emulator.bpf import structs as S
from emulator.bpf.datapath import EBPF_DIR
from emulator.nic import wire


def layout(cls) -> list[tuple[str, int, int]]:
    return [(name, getattr(cls, name).offset, getattr(cls, name).size) for name, *_ in cls._fields_]


def test_mirrors_match_the_compiled_structs(dp):
    for cname, (mirror, table, side) in S.MIRRORS.items():
        t = dp.table(table)
        theirs = t.Key if side == "key" else t.Leaf
        if issubclass(theirs, ct.Array):  # per-CPU maps: one value per CPU
            theirs = theirs._type_
        assert ct.sizeof(theirs) == ct.sizeof(mirror), cname
        assert layout(theirs) == layout(mirror), cname


def test_constants_match():
    text = EBPF_DIR / "include" / "bp_consts.h"
    consts = {}
    for line in open(text):
        parts = line.split()
        if len(parts) >= 3 and parts[0] == "#define" and parts[2][0].isdigit():
            consts[parts[1]] = int(parts[2], 0)
    assert consts["BP_ROCE_PORT"] == S.ROCE_PORT
    assert consts["BP_MAX_IFINDEX"] == S.MAX_IFINDEX
    assert consts["BP_MAX_NEXTHOPS"] == S.MAX_NEXTHOPS
    assert consts["BP_NUM_PRIO"] == S.NUM_PRIO
    assert consts["BP_MAX_ROUTES"] == S.MAX_ROUTES
    assert consts["BP_PROB_ONE"] == S.PROB_ONE
    assert consts["BP_PORT_SWITCH"] == S.PORT_SWITCH
    assert consts["BP_PORT_PEER_TBF"] == S.PORT_PEER_TBF
    assert consts["BP_PORT_PFC"] == S.PORT_PFC
    assert consts["BP_PORT_PRIO_QUEUES"] == S.PORT_PRIO_QUEUES
    assert consts["BP_PORT_UP"] == S.PORT_UP
    assert consts["BP_PORT_DOWN"] == S.PORT_DOWN
    assert consts["BP_PORT_AVOID"] == S.PORT_AVOID
    assert (consts["BP_TAG_PRIO_SHIFT"], consts["BP_TAG_IFINDEX_MASK"]) == (S.TAG_PRIO_SHIFT, S.TAG_IFINDEX_MASK)
    assert S.MAX_IFINDEX - 1 <= S.TAG_IFINDEX_MASK
    assert consts["BP_ETH_P_MAC_CONTROL"] == S.ETH_P_MAC_CONTROL
    assert consts["BP_PFC_OPCODE"] == S.PFC_OPCODE
    assert consts["BP_PAUSE_OPCODE"] == S.PAUSE_OPCODE
    assert consts["BP_ETH_P_KICK"] == S.ETH_P_KICK
    assert (consts["BP_TC_MAJOR"], consts["BP_TC_LEAF_BASE"], consts["BP_TC_CONTROL"]) == \
        (S.TC_MAJOR, S.TC_LEAF_BASE, S.TC_CONTROL)
    assert (consts["BP_EV_XOFF"], consts["BP_EV_XON"], consts["BP_EV_PFC"]) == (S.EV_XOFF, S.EV_XON, S.EV_PFC)
    assert consts["BP_EVENT_PAGES"] == S.EVENT_PAGES
    assert {a: consts[f"BP_WD_{a.upper()}"] for a in S.WD_ACTIONS} == S.WD_ACTIONS
    assert consts["BP_PACING_ONE"] == S.PACING_ONE
    assert tuple(consts[f"BP_PACING_EDGE_{i}"] for i in range(len(S.PACING_EDGES))) == S.PACING_EDGES
    assert f"BP_PACING_EDGE_{len(S.PACING_EDGES)}" not in consts
    assert consts["BP_PACING_BINS"] == S.PACING_BINS
    assert consts["BP_PACING_NS_PER_ONE"] * S.PACING_ONE == 10**9 == S.PACING_NS_PER_ONE * S.PACING_ONE
    assert consts["BP_PACING_GAP_MAX"] == S.PACING_GAP_MAX
    modes = {"five-tuple": "BP_HASH_FIVE_TUPLE", "qpn": "BP_HASH_QPN", "qpn-psn": "BP_HASH_QPN_PSN", "ev": "BP_HASH_EV"}
    assert {m: consts[c] for m, c in modes.items()} == S.HASH_MODES


# Structs no map holds, compiled into maps of their own so bcc shows their layout: the PFC
# agent's events (mirrored by S.Event) and the BTH the parser reads (the wire's BTH_STRUCT).
LAYOUT_PROBE = """
#include <linux/types.h>
#include "bp_structs.h"
#include "bp_parse.h"
BPF_ARRAY(bth_layout, struct bp_bth, 1);
BPF_ARRAY(event_layout, struct bp_event, 1);
"""


@pytest.fixture(scope="module")
def probe():
    from bcc import BPF

    b = BPF(text=LAYOUT_PROBE, cflags=[f"-I{EBPF_DIR / 'include'}", "-Wno-unused-function"])
    yield b
    b.cleanup()


def test_event_mirror_matches_the_compiled_struct(probe):
    theirs = probe["event_layout"].Leaf
    assert ct.sizeof(theirs) == ct.sizeof(S.Event)
    assert layout(theirs) == layout(S.Event)


def test_the_parsers_bth_has_the_wires_layout(probe):
    theirs = probe["bth_layout"].Leaf
    sizes = [struct.calcsize("!" + c) for c in wire.BTH_STRUCT.format.lstrip("!")]
    offsets = [sum(sizes[:i]) for i in range(len(sizes))]
    assert ct.sizeof(theirs) == wire.BTH_STRUCT.size == wire.BTH_LEN
    assert [(off, size) for _, off, size in layout(theirs)] == list(zip(offsets, sizes))
