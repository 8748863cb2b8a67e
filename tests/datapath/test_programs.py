"""The switch programs on crafted packets, with BPF_PROG_TEST_RUN: verdict, output bytes and
the counter each outcome must move. Katran-style fixtures: input packet, expected packet,
verdict."""
from __future__ import annotations

import ctypes as ct
import ipaddress
import random

import pytest
from scapy.layers.inet import ICMP, IP, UDP
from scapy.layers.l2 import ARP, Ether

from emulator.bpf import hashref, structs as S
from emulator.bpf.datapath import TC_EGRESS_PROG, TC_INGRESS_PROG
from emulator.bpf.syscall import prog_test_run
from emulator.fabric import netns

from .conftest import (FIBER_PORT, IN_PORT, MAC_IN, MAC_PEER, NEXT_HOPS, NODE_ID, NS, next_hop_entry, reset_port,
                       skb_ctx)

TC_ACT_OK, TC_ACT_SHOT, TC_ACT_REDIRECT = 0, 2, 7
ROUTE = ipaddress.IPv4Network("198.18.1.0/24")


def bth(opcode=0x07, qpn=0x123, psn=5) -> bytes:
    return bytes([opcode, 0]) + b"\xff\xff" + qpn.to_bytes(4, "big") + psn.to_bytes(4, "big")


def roce(src="198.18.0.2", dst="198.18.1.2", sport=49152, qpn=0x123, psn=5, tos=(26 << 2) | 2, ttl=64,
         payload=256, **ip) -> bytes:
    pkt = (Ether(src=MAC_PEER, dst=MAC_IN) / IP(src=src, dst=dst, tos=tos, ttl=ttl, **ip) /
           UDP(sport=sport, dport=S.ROCE_PORT, chksum=0) / (bth(qpn=qpn, psn=psn) + bytes(payload + 4)))
    return bytes(pkt)


def run_tc(dp, prog: str, data: bytes, port: int = IN_PORT):
    with netns.entered(NS):
        return prog_test_run(dp.fds[prog], data, ctx=skb_ctx(port))


def run_in(dp, data: bytes, port: int = IN_PORT):
    """The ingress program on ``data`` arriving at ``port``."""
    return run_tc(dp, TC_INGRESS_PROG, data, port)


def next_hop(out: bytes, data: bytes) -> int:
    """The next hop a forwarded frame was rewritten for (its MACs name it: conftest.next_hop_entry),
    after checking that nothing else changed but its TTL and IP checksum."""
    i = out[5]
    assert out[:12] == bytes(S.mac_bytes(f"02:62:70:00:09:{i:02x}")) + bytes(S.mac_bytes(f"02:62:70:00:07:{i + 1:02x}"))
    assert out[22] == data[22] - 1 and ip_checksum_ok(out)
    assert out[12:22] == data[12:22] and out[23:24] == data[23:24] and out[26:] == data[26:]
    return NEXT_HOPS[0] + i


def forwarded(dp, data: bytes) -> int:
    """Run ``data`` in at IN_PORT, which must forward it: the next hop it chose."""
    r = run_in(dp, data)
    assert r.retval == TC_ACT_REDIRECT
    return next_hop(r.data, data)


def counters_delta(dp, port, before):
    after = dp.counters(port)
    return {k: after[k] - before[k] for k in after if after[k] != before[k]}


# --- tc ingress: the dequeue side and forwarding ---

def test_roce_is_forwarded_to_the_hashed_next_hop_with_its_macs_and_ttl_rewritten(programmed):
    data = roce()
    want = hashref.flow_hash("qpn", NODE_ID, "198.18.0.2", "198.18.1.2", 17, 49152, 4791, 0x123, 5)
    out = NEXT_HOPS[want % len(NEXT_HOPS)]
    before, before_out = programmed.counters(IN_PORT), programmed.counters(out)
    assert forwarded(programmed, data) == out
    assert counters_delta(programmed, IN_PORT, before) == {"rx_pkts": 1, "rx_bytes": len(data), "roce_pkts": 1}
    assert counters_delta(programmed, out, before_out) == {"fwd_pkts": 1, "fwd_bytes": len(data)}


def test_ip_options_are_parsed_not_misforwarded(programmed):
    from scapy.layers.inet import IPOption_NOP

    data = roce(options=[IPOption_NOP()] * 4)
    want = hashref.flow_hash("qpn", NODE_ID, "198.18.0.2", "198.18.1.2", 17, 49152, 4791, 0x123, 5)
    assert forwarded(programmed, data) == NEXT_HOPS[want % len(NEXT_HOPS)]


@pytest.mark.parametrize("name,data,verdict,counter", [
    # (Frames shorter than an Ethernet header never reach tc, and the test run refuses an IPv4
    # frame shorter than an IP header, so those cases are not here.)
    ("IPv4 header cut by the options it claims", roce()[:14] + bytes([0x4F]) + roce()[15:34], TC_ACT_SHOT,
     "drop_truncated"),
    ("IP version 6 in an IPv4 frame", roce()[:14] + bytes([0x65]) + roce()[15:], TC_ACT_SHOT, "drop_ip_version"),
    ("IHL below 5", roce()[:14] + bytes([0x44]) + roce()[15:], TC_ACT_SHOT, "drop_ip_header"),
    ("UDP 4791 without a whole BTH", roce()[:14 + 20 + 8 + 6], TC_ACT_SHOT, "drop_roce_header"),
    ("truncated UDP", roce()[:14 + 20 + 4], TC_ACT_SHOT, "drop_truncated"),
    ("non-RoCE UDP", bytes(Ether(src=MAC_PEER, dst=MAC_IN) / IP(src="198.18.0.2", dst="198.18.1.2") /
                           UDP(sport=1234, dport=53) / bytes(32)), TC_ACT_OK, "kernel_pkts"),
    ("ICMP", bytes(Ether(src=MAC_PEER, dst=MAC_IN) / IP(src="198.18.0.2", dst="198.18.1.2") / ICMP()),
     TC_ACT_OK, "kernel_pkts"),
    ("ARP", bytes(Ether(src=MAC_PEER, dst="ff:ff:ff:ff:ff:ff") / ARP(pdst="198.18.1.1")), TC_ACT_OK, "kernel_pkts"),
    ("TTL 1", roce(ttl=1), TC_ACT_OK, "ttl_expired"),
    ("no route", roce(dst="203.0.113.9"), TC_ACT_OK, "no_route"),
    ("fragment", roce(flags="MF"), TC_ACT_OK, "fragments"),
])
def test_ingress_fixtures(programmed, name, data, verdict, counter):
    before = programmed.counters(IN_PORT)
    r = run_in(programmed, data)
    assert r.retval == verdict, name
    if verdict == TC_ACT_OK:
        assert r.data == data, f"{name}: must take the kernel's path as it came"
    delta = counters_delta(programmed, IN_PORT, before)
    assert delta.get(counter) == 1, f"{name}: {delta}"
    assert delta.get("roce_pkts", 0) == 0, f"{name} must not be forwarded in eBPF"


def test_a_route_to_a_port_the_table_lacks_drops_and_counts(programmed):
    programmed.set_route(NODE_ID, ROUTE, [399])
    try:
        before = programmed.counters(IN_PORT)
        assert run_in(programmed, roce()).retval == TC_ACT_SHOT
        assert counters_delta(programmed, IN_PORT, before).get("drop_no_port") == 1
    finally:
        programmed.set_route(NODE_ID, ROUTE, NEXT_HOPS)


def test_non_switch_port_only_counts_the_dequeue(programmed):
    reset_port(programmed, IN_PORT)
    data = roce()
    r = run_in(programmed, data, port=FIBER_PORT)
    assert r.retval == TC_ACT_OK and r.data == data
    q = programmed.queue(IN_PORT, prio=3)
    assert q["deq_bytes"] == len(data) and q["deq_pkts"] == 1
    assert programmed.queue(IN_PORT)["deq_bytes"] == len(data)


@pytest.mark.parametrize("mode", list(S.HASH_MODES))
def test_kernel_hash_equals_python_reference(programmed, mode):
    """10,000 random RoCEv2 packets per mode over a route of 64 next hops (the most a route
    holds): the program's choice is hashref's hash modulo 64."""
    hops = [NEXT_HOPS[0] + i for i in range(S.MAX_NEXTHOPS)]
    for i, nh in enumerate(hops):
        programmed.set_port(nh, next_hop_entry(i))
    programmed.set_route(NODE_ID, ROUTE, hops)
    programmed.set_hash(mode)
    rng = random.Random(f"hash-{mode}")
    try:
        for _ in range(10_000):
            src = f"198.18.{rng.randrange(256)}.{rng.randrange(1, 255)}"
            dst = f"198.18.1.{rng.randrange(1, 255)}"
            sport, qpn, psn = rng.randrange(49152, 65536), rng.randrange(1 << 24), rng.randrange(1 << 24)
            data = roce(src=src, dst=dst, sport=sport, qpn=qpn, psn=psn, payload=0)
            want = hashref.flow_hash(mode, NODE_ID, src, dst, 17, sport, S.ROCE_PORT, qpn, psn)
            assert forwarded(programmed, data) == hops[want % len(hops)], (mode, src, dst, sport, qpn, psn)
    finally:
        programmed.set_route(NODE_ID, ROUTE, NEXT_HOPS)


# --- tc egress: queue accounting, WRED ECN, tail drop ---

def set_depth(dp, port: int, depth: int) -> None:
    reset_port(dp, port)
    dp.table("bp_queues")[ct.c_int(port * S.QUEUE_SLOTS + S.NUM_PRIO)] = S.Queue(depth, 0, 1, 0, depth)


def ip_checksum_ok(frame: bytes) -> bool:
    ihl = (frame[14] & 0xF) * 4
    words = sum(int.from_bytes(frame[14 + i:16 + i], "big") for i in range(0, ihl, 2))
    while words >> 16:
        words = (words & 0xFFFF) + (words >> 16)
    return words == 0xFFFF


def test_egress_enqueues_below_kmin_unchanged(programmed):
    set_depth(programmed, IN_PORT, 0)
    data = roce()
    r = run_tc(programmed, TC_EGRESS_PROG, data)
    assert r.retval == TC_ACT_OK and r.data == data
    total, prio = programmed.queue(IN_PORT), programmed.queue(IN_PORT, prio=3)
    assert total["enq_bytes"] == prio["enq_bytes"] == len(data)
    assert total["max_depth"] == len(data)
    assert programmed.counters(IN_PORT)["tx_pkts"] == 1


@pytest.mark.parametrize("tos", [(26 << 2) | 2, (26 << 2) | 1])
def test_egress_marks_ect_at_kmax_and_fixes_the_checksum(programmed, tos):
    set_depth(programmed, IN_PORT, 24000)
    data = roce(tos=tos)
    r = run_tc(programmed, TC_EGRESS_PROG, data)
    assert r.retval == TC_ACT_OK
    out = r.data
    assert out[15] & 3 == S.ECN_CE and out[15] >> 2 == 26
    assert ip_checksum_ok(out)
    assert out[:15] == data[:15] and out[16:24] == data[16:24] and out[26:] == data[26:]
    assert programmed.counters(IN_PORT)["ecn_marks"] == 1


@pytest.mark.parametrize("tos", [26 << 2, (26 << 2) | 3])
def test_egress_never_marks_non_ect_or_ce(programmed, tos):
    set_depth(programmed, IN_PORT, 24000)
    data = roce(tos=tos)
    r = run_tc(programmed, TC_EGRESS_PROG, data)
    assert r.retval == TC_ACT_OK and r.data == data
    assert programmed.counters(IN_PORT)["ecn_marks"] == 0


def test_wred_marks_a_fraction_between_kmin_and_kmax(programmed):
    """Halfway between kmin and kmax the probability is pmax/2 = 10%."""
    set_depth(programmed, IN_PORT, 16000)
    marked = 0
    for _ in range(4000):
        r = run_tc(programmed, TC_EGRESS_PROG, roce())
        marked += r.data[15] & 3 == S.ECN_CE
        dp_q = S.Queue(16000, 0, 1, 0, 16000)  # hold the depth still
        programmed.table("bp_queues")[ct.c_int(IN_PORT * S.QUEUE_SLOTS + S.NUM_PRIO)] = dp_q
    assert 0.07 < marked / 4000 < 0.13, marked


def test_egress_tail_drops_at_the_buffer(programmed):
    data = roce()
    set_depth(programmed, IN_PORT, 32000 - len(data) + 1)
    r = run_tc(programmed, TC_EGRESS_PROG, data)
    assert r.retval == TC_ACT_SHOT
    c = programmed.counters(IN_PORT)
    assert c["drop_buffer"] == 1 and c["tx_pkts"] == 0
    set_depth(programmed, IN_PORT, 32000 - len(data))
    assert run_tc(programmed, TC_EGRESS_PROG, data).retval == TC_ACT_OK


@pytest.mark.parametrize("loss", [0.0, 0.25, 1.0])
def test_egress_drops_with_the_paths_loss(programmed, loss):
    """A border's port towards a fiber with no netem: drops with the configured probability,
    each counted as loss, not as a full buffer."""
    entry = S.Port(NODE_ID, S.PORT_SWITCH, 0, 1 << 30, S.mac_bytes(MAC_IN), S.mac_bytes(MAC_PEER),
                   min(0xFFFFFFFF, round(loss * 2**32)))
    programmed.set_port(IN_PORT, entry)
    reset_port(programmed, IN_PORT)
    n, dropped = 4000, 0
    for _ in range(n):
        dropped += run_tc(programmed, TC_EGRESS_PROG, roce()).retval == TC_ACT_SHOT
    c = programmed.counters(IN_PORT)
    assert c["drop_loss"] == dropped and c["drop_buffer"] == 0 and c["tx_pkts"] == n - dropped
    sigma = (loss * (1 - loss) / n) ** 0.5
    assert abs(dropped / n - loss) <= 5 * sigma + 1e-9, dropped


def test_egress_of_a_non_switch_port_is_untouched(programmed):
    reset_port(programmed, FIBER_PORT)
    data = roce()
    r = run_tc(programmed, TC_EGRESS_PROG, data, port=FIBER_PORT)
    assert r.retval == TC_ACT_OK and r.data == data
    assert programmed.queue(FIBER_PORT)["enq_bytes"] == 0


def test_attach_reads_back_and_detach_removes_everything(dp, ns):
    """On a real veth in a namespace: both tc programs attach and read back by program id, and
    no XDP program is put on the port; detaching leaves the port as it was."""
    from emulator.bpf.datapath import TC_EGRESS_PARENT, TC_INGRESS_PARENT
    from emulator.fabric import rtnl

    dp.attach(NS, ns, "peer0", switch=True)
    index = ns.link_lookup(ifname="peer0")[0]
    with netns.entered(NS):
        sock = rtnl.socket_here()
    try:
        assert rtnl.bpf_filters(sock, index, TC_INGRESS_PARENT) == [(TC_INGRESS_PROG, dp.prog_ids[TC_INGRESS_PROG])]
        assert rtnl.bpf_filters(sock, index, TC_EGRESS_PARENT) == [(TC_EGRESS_PROG, dp.prog_ids[TC_EGRESS_PROG])]
    finally:
        sock.close()
    xdp = ns.get_links(index)[0].get_attr("IFLA_XDP")
    assert xdp is None or xdp.get_attr("IFLA_XDP_ATTACHED") in (None, 0, "none")
    dp.detach(NS, ns, "peer0")
    assert not any(q.get_attr("TCA_KIND") == "clsact" for q in ns.get_qdiscs(index=index))


def test_a_down_port_sends_nothing_and_takes_nothing_in_but_its_queue_drains(programmed):
    """A fault (a cut fiber, a failed switch) marks a port down: its egress drops everything,
    RoCE or not, before it counts as queued; what it receives is dropped; and the peer that
    receives what its queue still held counts the dequeue, so the depth stays exact."""
    down = S.Port(NODE_ID, S.PORT_SWITCH | S.PORT_DOWN, 0, 32000, S.mac_bytes(MAC_IN), S.mac_bytes(MAC_PEER))
    programmed.set_port(IN_PORT, down)
    reset_port(programmed, IN_PORT)
    try:
        data = roce()
        assert run_tc(programmed, TC_EGRESS_PROG, data).retval == TC_ACT_SHOT
        assert run_in(programmed, data).retval == TC_ACT_SHOT
        c = programmed.counters(IN_PORT)
        assert c["drop_link_down"] == 2 and c["tx_pkts"] == 0 and c["roce_pkts"] == 0
        assert programmed.queue(IN_PORT)["enq_bytes"] == 0
        # Its queue drains into the peer, which counts the dequeue as usual.
        assert run_in(programmed, data, port=FIBER_PORT).retval == TC_ACT_OK
        assert programmed.queue(IN_PORT)["deq_bytes"] == len(data)
    finally:
        programmed.set_port(IN_PORT, S.Port(NODE_ID, S.PORT_SWITCH, 0, 32000, S.mac_bytes(MAC_IN),
                                            S.mac_bytes(MAC_PEER)))


def test_adaptive_pins_a_flow_until_a_gap_or_its_port_is_avoided(programmed):
    """ecmp.adaptive: a flow keeps its next hop when the weights change, picks anew after a gap
    longer than the flowlet gap, and leaves at once a port taken out of ECMP (BP_PORT_AVOID)."""
    dp = programmed
    dst = ROUTE
    data = roce(qpn=0x4242)
    try:
        dp.set_adaptive(True, flowlet_gap_ns=10**10)  # 10 s: nothing here is a gap
        first = forwarded(dp, data)
        others = [nh for nh in NEXT_HOPS if nh != first]
        dp.set_route(NODE_ID, dst, others * 8)  # new weights: its next hop has none
        assert forwarded(dp, data) == first  # pinned: no reorder
        reset_port(dp, IN_PORT)
        entry = dp.port_entry(first)
        dp.set_port(first, S.Port(entry.node_id, entry.flags | S.PORT_AVOID, entry.peer_queue, entry.buffer,
                                  entry.smac, entry.dmac))
        moved = forwarded(dp, data)
        assert moved in others and dp.counters(IN_PORT)["ar_moved"] == 1
        dp.set_port(first, entry)
        assert forwarded(dp, data) == moved  # pinned to its new one
        # A gap longer than the flowlet gap: the flow follows the table again.
        dp.set_adaptive(True, flowlet_gap_ns=0)
        dp.set_route(NODE_ID, dst, [first])
        assert forwarded(dp, data) == first
        # Off: every packet follows the hash over the slots, pins or not.
        dp.set_adaptive(False)
        dp.set_route(NODE_ID, dst, [moved])
        assert forwarded(dp, data) == moved
    finally:
        dp.set_adaptive(False)
        dp.set_route(NODE_ID, dst, NEXT_HOPS)
