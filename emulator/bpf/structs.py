"""The one Python mirror of ebpf/include/bp_consts.h and bp_structs.h.

Every struct here has the same fields, in the same order and with the same C types, as its C
twin; tests/datapath compares them against bcc's own view of the compiled program.
"""
from __future__ import annotations

import ctypes as ct

from emulator.model import spec
from emulator.nic import wire

ROCE_PORT = wire.ROCE_PORT  # bp_consts.h's BP_ROCE_PORT (tests/datapath checks it)
MAX_IFINDEX = 4096
MAX_NEXTHOPS = 64
NUM_PRIO = 8
QUEUE_SLOTS = NUM_PRIO + 1
MAX_ROUTES = 65536
PROB_ONE = 65536

# The hash modes by their number in bp_consts.h (BP_HASH_*).
HASH_MODES = {mode: i for i, mode in enumerate(spec.HASH_MODES)}

PORT_SWITCH = 1
PORT_PEER_TBF = 2
PORT_PFC = 4
PORT_PRIO_QUEUES = 8
PORT_UP = 16
PORT_DOWN = 32  # a fault: a cut fiber's border ports, a failed switch's ports
PORT_AVOID = 64  # out of its switch's ECMP groups: adaptive moves the flows pinned to it
TAG_PRIO_SHIFT = 12
TAG_IFINDEX_MASK = 0xFFF

# 802.1Qbb PFC and the frames around it.
ETH_P_MAC_CONTROL = 0x8808
PFC_OPCODE = 0x0101
PAUSE_OPCODE = 0x0001
ETH_P_KICK = 0x88B5
# The egress HTB's classes: priority p in 1:(TC_LEAF_BASE + p), MAC control in 1:TC_CONTROL.
TC_MAJOR = 1
TC_LEAF_BASE = 0x10
TC_CONTROL = 0x18
# bp_event.kind
EV_XOFF = 1
EV_XON = 2
EV_PFC = 3
EVENT_PAGES = 64
# The watchdog's actions (bp_wd.action), by spec.PFC_WATCHDOG_ACTIONS' names.
WD_ACTIONS = {"drop": 1, "forward": 2, "alert": 3}

# Dequeue pacing: busy gap / ideal gap, binned at these edges (in 1/PACING_ONE).
PACING_ONE = 100
PACING_EDGES = (25, 50, 75, 90, 110, 125, 150, 200, 400)
PACING_BINS = len(PACING_EDGES) + 1
PACING_NS_PER_ONE = 10_000_000
PACING_GAP_MAX = 0xFFFFFFFF

ECN_MASK = 3
ECN_CE = 3


class Port(ct.Structure):
    _fields_ = [
        ("node_id", ct.c_uint32),
        ("flags", ct.c_uint32),
        ("peer_queue", ct.c_uint32),
        ("buffer", ct.c_uint32),
        ("smac", ct.c_uint8 * 6),
        ("dmac", ct.c_uint8 * 6),
        ("loss", ct.c_uint32),
        ("peer_rate", ct.c_uint32),
        ("headroom", ct.c_uint32),
    ]


class Config(ct.Structure):
    _fields_ = [
        ("hash_mode", ct.c_uint32),
        ("kmin", ct.c_uint32),
        ("kmax", ct.c_uint32),
        ("pmax", ct.c_uint32),
        ("lossless", ct.c_uint32),
        ("xoff", ct.c_uint32),
        ("xon", ct.c_uint32),
        ("tagger_dscp", ct.c_uint32),
        ("tagger_prio", ct.c_uint32),
        ("adaptive", ct.c_uint32),
        ("flowlet_gap_ns", ct.c_uint32),
    ]


class RouteKey(ct.Structure):
    _fields_ = [("prefixlen", ct.c_uint32), ("node_id", ct.c_uint32), ("addr", ct.c_uint32)]


class Route(ct.Structure):
    _fields_ = [("count", ct.c_uint32), ("ifindex", ct.c_uint32 * MAX_NEXTHOPS)]


class Queue(ct.Structure):
    _fields_ = [
        ("enq_bytes", ct.c_uint64),
        ("deq_bytes", ct.c_uint64),
        ("enq_pkts", ct.c_uint64),
        ("deq_pkts", ct.c_uint64),
        ("max_depth", ct.c_uint64),
    ]


class Pacing(ct.Structure):
    _fields_ = [
        ("last_ns", ct.c_uint64),
        ("last_len", ct.c_uint32),
        ("backlogged", ct.c_uint32),
        ("busy_ns", ct.c_uint64),
        ("busy_bytes", ct.c_uint64),
        ("bins", ct.c_uint64 * PACING_BINS),
    ]


class Counters(ct.Structure):
    _fields_ = [(name, ct.c_uint64) for name in (
        "rx_pkts", "rx_bytes", "roce_pkts", "kernel_pkts", "no_route", "ttl_expired", "fragments",
        "drop_truncated", "drop_ip_version", "drop_ip_header", "drop_roce_header", "fwd_pkts",
        "fwd_bytes", "tx_pkts", "tx_bytes", "ecn_marks", "drop_buffer", "drop_no_port", "drop_loss",
        "mac_control", "kicks", "tagged", "drop_link_down", "ar_moved", "drop_nomem",
    )]


class Ingress(ct.Structure):
    _fields_ = [
        ("bytes", ct.c_uint64),
        ("max_bytes", ct.c_uint64),
        ("paused", ct.c_uint32),
        ("pad", ct.c_uint32),
    ]


class PfcCounters(ct.Structure):
    _fields_ = [(name, ct.c_uint64) for name in (
        "tx_pause", "tx_resume", "rx_pause", "rx_resume", "drop_headroom", "wd_tx_ok", "wd_tx_drop",
        "wd_rx_ok", "wd_rx_drop", "pause_ignored",
    )]


class Watchdog(ct.Structure):
    _fields_ = [
        ("stormed", ct.c_uint32),
        ("action", ct.c_uint32),
        ("last_pause_ns", ct.c_uint64),
    ]


PFC_COUNTER_NAMES = tuple(name for name, _ in PfcCounters._fields_)


class Event(ct.Structure):
    _fields_ = [
        ("ns", ct.c_uint64),
        ("kind", ct.c_uint32),
        ("ifindex", ct.c_uint32),
        ("prio", ct.c_uint32),
        ("vector", ct.c_uint32),
        ("quanta", ct.c_uint16 * NUM_PRIO),
    ]


COUNTER_NAMES = tuple(name for name, _ in Counters._fields_)
# Counters of frames the datapath dropped, each with its reason.
DROP_COUNTERS = tuple(n for n in COUNTER_NAMES if n.startswith("drop_"))

# struct name in C -> (mirror, map whose key or value has that type, "key" | "leaf")
MIRRORS = {
    "bp_port": (Port, "bp_ports", "leaf"),
    "bp_config": (Config, "bp_config", "leaf"),
    "bp_route_key": (RouteKey, "bp_routes", "key"),
    "bp_route": (Route, "bp_routes", "leaf"),
    "bp_queue": (Queue, "bp_queues", "leaf"),
    "bp_pacing": (Pacing, "bp_pacing", "leaf"),
    "bp_counters": (Counters, "bp_counters", "leaf"),
    "bp_ingress": (Ingress, "bp_ingress", "leaf"),
    "bp_pfc_counters": (PfcCounters, "bp_pfc", "leaf"),
    "bp_wd": (Watchdog, "bp_wd", "leaf"),
}


def mac_bytes(mac: str) -> ct.Array:
    return (ct.c_uint8 * 6)(*bytes.fromhex(mac.replace(":", "")))
