"""PFC in the switch programs, on crafted packets (BPF_PROG_TEST_RUN): ingress accounting and its
tag, XOFF, headroom drops, the dequeue that gives bytes back, PFC frames received, Tagger's
re-tagging and the watchdog's drops. Each fixture: input packet, expected packet, verdict, and
the counter or map entry it must move."""
from __future__ import annotations

import ctypes as ct
import struct

import pytest
from scapy.layers.inet import IP

from emulator.bpf import pfc as agent, structs as S
from emulator.bpf.datapath import DSCP_TAGGED, TC_EGRESS_PROG
from emulator.bpf.syscall import prog_test_run
from emulator.fabric import netns

from .conftest import FIBER_PORT, IN_PORT, MAC_IN, MAC_PEER, NODE_ID, NS
from .test_programs import TC_ACT_OK, TC_ACT_SHOT, ip_checksum_ok, roce, run_in

UPSTREAM = 301  # the port the packet came in by (a port of the same switch as IN_PORT)
PRIO, TAGGED_PRIO = 3, 4
XOFF, XON, HEADROOM = 10_000, 5_000, 6_000


def skb_ctx(ifindex: int, ingress_ifindex: int) -> bytes:
    """struct __sk_buff with the test run's device and the port the packet came in by."""
    buf = bytearray(192)
    struct.pack_into("=I", buf, 36, ingress_ifindex)  # offsetof(struct __sk_buff, ingress_ifindex)
    struct.pack_into("=I", buf, 40, ifindex)  # offsetof(struct __sk_buff, ifindex)
    return bytes(buf)


def priority_of(ctx_out: bytes) -> int:
    return struct.unpack_from("=I", ctx_out, 32)[0]  # offsetof(struct __sk_buff, priority)


def egress(dp, data: bytes, port: int = IN_PORT, came_in: int = UPSTREAM):
    with netns.entered(NS):
        return prog_test_run(dp.fds[TC_EGRESS_PROG], data, ctx=skb_ctx(port, came_in))


def zero(dp, table: str, key: int, value) -> None:
    t = dp.table(table)
    cur = t[ct.c_int(key)]
    t[ct.c_int(key)] = type(cur)() if not isinstance(cur, ct.Array) else (value * len(cur))()


@pytest.fixture
def pfc(programmed):
    dp = programmed
    flags = S.PORT_SWITCH | S.PORT_PFC | S.PORT_PRIO_QUEUES
    dp.set_port(IN_PORT, S.Port(NODE_ID, flags, 0, 32000, S.mac_bytes(MAC_IN), S.mac_bytes(MAC_PEER), 0, 0, HEADROOM))
    dp.set_port(UPSTREAM, S.Port(NODE_ID, flags, 0, 32000, S.mac_bytes("02:62:70:00:07:01"),
                                 S.mac_bytes("02:62:70:00:09:00"), 0, 0, HEADROOM))
    # The port at the far end of IN_PORT's wire, in another node: it sees IN_PORT's queue drain.
    dp.set_port(FIBER_PORT, S.Port(NODE_ID + 1, S.PORT_PFC, IN_PORT, 0, S.mac_bytes(MAC_PEER),
                                   S.mac_bytes(MAC_IN)))
    dp.set_dscp_prio(PRIO, TAGGED_PRIO)
    dp.set_pfc((PRIO, TAGGED_PRIO), XOFF, XON)
    for port in (IN_PORT, UPSTREAM, FIBER_PORT):
        for prio in range(S.NUM_PRIO):
            key = port * S.NUM_PRIO + prio
            dp.table("bp_ingress")[ct.c_int(key)] = S.Ingress()
            dp.table("bp_wd")[ct.c_int(key)] = S.Watchdog()
            zero(dp, "bp_pfc", key, S.PfcCounters)
        for slot in range(S.QUEUE_SLOTS):
            dp.table("bp_queues")[ct.c_int(port * S.QUEUE_SLOTS + slot)] = S.Queue()
    yield dp
    dp.set_pfc((), 0, 0)
    dp.set_dscp_prio(PRIO)
    dp.set_port(IN_PORT, S.Port(NODE_ID, S.PORT_SWITCH, 0, 32000, S.mac_bytes(MAC_IN), S.mac_bytes(MAC_PEER)))
    dp.set_port(FIBER_PORT, S.Port(NODE_ID + 1, 0, IN_PORT, 0, S.mac_bytes(MAC_PEER), S.mac_bytes(MAC_IN)))


def tag_of(frame: bytes) -> int:
    return struct.unpack_from("=H", frame, 14 + 20 + 6)[0]  # the UDP checksum field, as the kernel wrote it


def test_a_lossless_packet_counts_against_its_ingress_and_carries_the_tag(pfc):
    data = roce()
    r = egress(pfc, data)
    assert r.retval == TC_ACT_OK
    assert struct.unpack("=H", r.data[40:42])[0] == UPSTREAM | (PRIO << S.TAG_PRIO_SHIFT)
    assert r.data[:40] == data[:40] and r.data[42:] == data[42:]
    assert pfc.ingress(UPSTREAM, PRIO) == {"bytes": len(data), "max_bytes": len(data), "paused": False}
    assert priority_of(r.ctx) == (S.TC_MAJOR << 16) | (S.TC_LEAF_BASE + PRIO)


def test_xoff_then_the_dequeue_gives_bytes_back_and_xon(pfc):
    data = roce()
    outs = []
    while not pfc.ingress(UPSTREAM, PRIO)["paused"]:
        r = egress(pfc, data)
        assert r.retval == TC_ACT_OK
        outs.append(r.data)
    assert pfc.ingress(UPSTREAM, PRIO)["bytes"] >= XOFF > pfc.ingress(UPSTREAM, PRIO)["bytes"] - len(data)
    for out in outs:
        r = run_in(pfc, out, FIBER_PORT)  # the packet arrives at the far end of IN_PORT's wire
        assert r.retval == TC_ACT_OK
        assert tag_of(r.data[-len(out):]) == 0  # the tag is cleared before anyone else sees it
    assert pfc.ingress(UPSTREAM, PRIO) == {"bytes": 0, "max_bytes": len(outs) * len(data), "paused": False}


def test_past_xoff_and_headroom_a_lossless_packet_is_dropped_and_counted(pfc):
    data = roce()
    admitted = 0
    while egress(pfc, data).retval == TC_ACT_OK:
        admitted += 1
        assert admitted * len(data) <= XOFF + HEADROOM
    assert (admitted + 1) * len(data) > XOFF + HEADROOM
    assert pfc.pfc_counters(UPSTREAM, PRIO)["drop_headroom"] == 1
    assert pfc.counters(IN_PORT)["drop_buffer"] == 0


def test_a_lossy_packet_is_not_accounted_and_keeps_tail_drop(pfc):
    r = egress(pfc, roce(tos=0))
    assert r.retval == TC_ACT_OK and tag_of(r.data) == 0
    assert pfc.ingress(UPSTREAM, 0)["bytes"] == 0
    assert priority_of(r.ctx) == (S.TC_MAJOR << 16) | S.TC_LEAF_BASE


@pytest.mark.parametrize("quanta", [0xFFFF, 0])
def test_a_pfc_frame_is_counted_and_consumed(pfc, quanta):
    frame = agent.pfc_frame(bytes.fromhex(MAC_PEER.replace(":", "")), 1 << PRIO, {PRIO: quanta})
    r = run_in(pfc, frame, IN_PORT)
    assert r.retval == TC_ACT_SHOT
    c = pfc.pfc_counters(IN_PORT, PRIO)
    assert (c["rx_pause"], c["rx_resume"]) == ((1, 0) if quanta else (0, 1))


def test_a_pfc_frame_on_a_port_without_pfc_is_dropped_as_mac_control(pfc):
    before = pfc.counters(FIBER_PORT)["mac_control"]
    pfc.set_port(FIBER_PORT, S.Port(NODE_ID + 1, 0, IN_PORT, 0, S.mac_bytes(MAC_PEER), S.mac_bytes(MAC_IN)))
    frame = agent.pfc_frame(bytes(6), 1 << PRIO, {PRIO: 100})
    assert run_in(pfc, frame, FIBER_PORT).retval == TC_ACT_SHOT
    assert pfc.counters(FIBER_PORT)["mac_control"] == before + 1


def test_a_pfc_frame_sent_is_counted_and_goes_to_the_control_class(pfc):
    frame = agent.pfc_frame(bytes(6), 1 << PRIO, {PRIO: 0xFFFF})
    r = egress(pfc, frame, came_in=0)
    assert r.retval == TC_ACT_OK and r.data == frame
    assert pfc.pfc_counters(IN_PORT, PRIO)["tx_pause"] == 1
    assert priority_of(r.ctx) == (S.TC_MAJOR << 16) | S.TC_CONTROL


def test_tagger_moves_a_bounce_to_its_priority(pfc):
    for port in (IN_PORT, UPSTREAM):
        entry = pfc.port_entry(port)
        entry.flags |= S.PORT_UP
        pfc.set_port(port, entry)
    pfc.set_pfc((PRIO, TAGGED_PRIO), XOFF, XON, tagger_prio=TAGGED_PRIO)
    before = pfc.counters(IN_PORT)["tagged"]
    r = egress(pfc, roce())
    assert r.retval == TC_ACT_OK
    ip = IP(r.data[14:])
    assert ip.tos == (DSCP_TAGGED << 2) | 2
    assert ip_checksum_ok(r.data)
    assert priority_of(r.ctx) == (S.TC_MAJOR << 16) | (S.TC_LEAF_BASE + TAGGED_PRIO)
    # It still counts against its ingress at the priority it came in at.
    assert pfc.ingress(UPSTREAM, PRIO)["bytes"] == len(r.data)
    assert tag_of(r.data) == UPSTREAM | (PRIO << S.TAG_PRIO_SHIFT)
    assert pfc.counters(IN_PORT)["tagged"] == before + 1
    # Not a bounce: in from below (a port that is not up), out up, stays.
    entry = pfc.port_entry(UPSTREAM)
    entry.flags &= ~S.PORT_UP
    pfc.set_port(UPSTREAM, entry)
    assert IP(egress(pfc, roce()).data[14:]).tos == (26 << 2) | 2


@pytest.mark.parametrize("action,verdict", [("drop", TC_ACT_SHOT), ("forward", TC_ACT_OK), ("alert", TC_ACT_OK)])
def test_a_stormed_queue_drops_only_in_drop_mode(pfc, action, verdict):
    pfc.table("bp_wd")[ct.c_int(IN_PORT * S.NUM_PRIO + PRIO)] = S.Watchdog(1, S.WD_ACTIONS[action], 0)
    assert egress(pfc, roce()).retval == verdict
    assert pfc.pfc_counters(IN_PORT, PRIO)["wd_tx_drop"] == (1 if action == "drop" else 0)
    # Its PAUSEs: ignored unless alert.
    frame = agent.pfc_frame(bytes(6), 1 << PRIO, {PRIO: 0xFFFF})
    assert run_in(pfc, frame, IN_PORT).retval == TC_ACT_SHOT
    assert pfc.pfc_counters(IN_PORT, PRIO)["pause_ignored"] == (0 if action == "alert" else 1)
    assert pfc.table("bp_wd")[ct.c_int(IN_PORT * S.NUM_PRIO + PRIO)].last_pause_ns > 0
