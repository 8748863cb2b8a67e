"""The eBPF datapath on whole fabrics: how each hash mode spreads 16 QPs per host pair over the
long-haul paths, and the true queue depth of a port under overload held against the qdisc's."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from emulator.bpf.structs import DROP_COUNTERS
from emulator.control import client
from emulator.fabric import netns
from emulator.model import plan, spec
from emulator.stats import jain

from .conftest import REPO, TOPOLOGIES, bp, bp_json, stolen, wait_for_quiet, watch

QPS = 16
FRAME = 4096 + 4 + 12 + 8 + 20 + 14  # a 4 KB RoCE write on the wire


def rocegen(name: str, node: str, *args: str) -> subprocess.Popen:
    return netns.popen(f"bp-{name}-{node}", [sys.executable, "-m", "emulator.tools.rocegen", *args], cwd=REPO,
                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def start_receiver(name: str, node: str, qps: int, timeout: float = 60) -> subprocess.Popen:
    """A counting receiver; finish() it with ``expect``, the packets its senders sent: it stops
    once they all came, or 2 s later (what is missing then was lost)."""
    p = rocegen(name, node, "recv", "--qps", str(qps), "--timeout", str(timeout))
    line = p.stdout.readline()
    assert line.strip() == "ready", f"receiver on {node}: {line!r} {p.stderr.read() if p.poll() is not None else ''}"
    return p


def start_together(senders: list[subprocess.Popen]) -> None:
    """Release gated senders (rocegen send --gate) at once, once every one has its sockets
    open: an incast needs them to overlap, and Python start-up differs by up to a second."""
    for s in senders:
        line = s.stdout.readline()
        assert line.strip() == "ready", f"sender: {line!r} {s.stderr.read() if s.poll() is not None else ''}"
    for s in senders:
        s.stdin.write("go\n")
        s.stdin.flush()


def finish(p: subprocess.Popen, timeout: float = 120, expect: int | None = None) -> dict:
    out, err = p.communicate(f"expect {expect}\n" if expect is not None else None, timeout=timeout)
    assert p.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def stats(name: str) -> dict:
    return client.request(name, {"op": "stats"})["stats"]


def port_counters(body: dict) -> dict[tuple[str, str], dict]:
    return {(p["node"], p["ifname"]): p for p in body["ports"]}


def lost_where(before: dict, after: dict) -> str:
    """The drops the datapath and the qdiscs counted between two readings, by port and reason."""
    seen = []
    for key, p in after.items():
        b = before[key]
        counts = {r: p["counters"][r] - b["counters"][r] for r in DROP_COUNTERS}
        counts.update({r: p["link"][r] - b["link"][r] for r in p["link"]})
        if p["qdisc"] is not None:
            counts["qdisc drops"] = p["qdisc"]["drops"] - b["qdisc"]["drops"]
        seen += [f"{key[0]}:{key[1]} {r} {n}" for r, n in counts.items() if n]
    return "drops counted: " + (", ".join(seen) if seen else "none")


def custom_topology(tmp_path: Path, base: str, edit) -> Path:
    doc = yaml.safe_load((TOPOLOGIES / f"{base}.yaml").read_text())
    edit(doc)
    path = tmp_path / f"{base}-test.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_ecmp_spreads_qps_over_long_haul_paths_by_hash_mode(fabrics, tmp_path):
    """4 east->west host pairs x 16 QPs over the 8 long-haul paths, in every hash mode.

    The default fabric, with one path degraded to 3/400 of its rate (as a failing link
    would leave it) so that packets of one QP sprayed over unequal paths can overtake each other:
    Sprayed, an eighth of the packets (7 Mb/s) meet that path's 3 Mb/s and queue there (its
    shaper's burst allowance would let a path that is merely slower carry them unqueued). The
    senders start together: one alone puts 1.8 Mb/s on the path, and senders that started
    Python a moment apart, each done in 0.2 s, could leave it unqueued.
    The UDP source port is fixed per host pair (as Meta's NICs sent it) except in `ev` mode,
    where it is the per-QP entropy value that mode reads.
    """
    topo = custom_topology(tmp_path, "cross-dc",
                           lambda d: d["wan"].update(overrides={0: {"rate": "3Gbps"}}))
    name = fabrics("tecmp", topo, "--no-wan-delay")
    p = plan.build(spec.load(topo), name)
    wan_ports = {(l.a.node, l.a.ifname): l.path for l in p.links
                 if l.kind == "wan" and p.node(l.a.node).role == "border" and l.a.node.startswith("east")}
    pairs = [(f"east-host{i}", f"west-host{i}", str(p.host_address(f"west-host{i}"))) for i in range(4)]
    report, inconclusive = {}, []
    for mode in spec.HASH_MODES:
        client.request(name, {"op": "set_hash", "hash": mode})
        # Nothing may be lost at this load, unless the hypervisor stalls a shaper by stealing its
        # vCPU: a run that lost packets while the fidelity monitor saw steal is taken again after
        # a quiet window, and one never run losslessly without steal leaves the test
        # inconclusive (said at the end); a loss the monitor saw no steal in fails.
        for attempt in range(3):
            before = port_counters(stats(name))
            # A receiver is told what its sender sent and gives up 2 s later: a lost packet must
            # not stretch the window the monitor judges (60 s would dilute a burst of steal).
            receivers = [start_receiver(name, dst, QPS) for _, dst, _ in pairs]
            verdict_of = watch(name)
            senders = [rocegen(name, src, "send", addr, "--qps", str(QPS), "--packets", "32", "--payload", "512",
                               "--pps", "3000", "--pair-id", str(i),
                               "--sport", "qp" if mode == "ev" else "pair", "--gate")
                       for i, (src, _, addr) in enumerate(pairs)]
            start_together(senders)
            each = [finish(s)["sent"] for s in senders]
            sent = sum(each)
            steal = stolen(verdict_of())  # while the queues built; the drain follows in well under 2 s
            got = [finish(r, expect=n) for r, n in zip(receivers, each)]
            after = port_counters(stats(name))
            arrived = sum(g["packets"] for g in got)
            lossless = arrived == sent and all(g["complete"] == QPS for g in got)
            where = lost_where(before, after)
            if lossless or not steal:
                break
            print(f"{mode}: {arrived} of {sent} packets arrived ({where}), {steal}: again")
            wait_for_quiet(30.0)
        conclusive = lossless or not steal
        if not conclusive:
            inconclusive.append(f"{mode}: {arrived} of {sent} arrived ({where}), {steal}")
        per_path = [0] * len(wan_ports)
        for key, path in wan_ports.items():
            per_path[path] = after[key]["counters"]["fwd_pkts"] - before[key]["counters"]["fwd_pkts"]
        shares = [n / sum(per_path) for n in per_path]
        reordered = sum(g["out_of_order"] for g in got)
        report[mode] = {"shares": [round(s, 3) for s in shares], "jain": round(jain(per_path), 3),
                        "paths_used": sum(1 for n in per_path if n), "out_of_order": reordered}
        print(f"{mode:<10} per-path shares {report[mode]['shares']} Jain {report[mode]['jain']} "
              f"paths used {report[mode]['paths_used']}/8 reordered at the receivers {reordered}/{sent}")
        if conclusive:
            assert lossless, (f"{mode}: {arrived} of {sent} packets arrived, QPs complete per receiver "
                              f"{[g['complete'] for g in got]} of {QPS}, the monitor saw no steal; {where}")
            assert sum(per_path) == sent, f"{mode}: the eBPF datapath forwarded {sum(per_path)} of {sent} over the WAN"
    # What a user reads: the CLI's tables and JSON carry the same counters.
    text = bp("stats", "--name", name).stdout
    assert "east-border0 RoCE packets per long-haul path" in text and "fidelity:" in text
    body = bp_json("stats", "--name", name)
    assert body["hash"] == "ev" and len(body["ports"]) == len(list(p.ports()))
    status = bp("status", "--name", name, "--no-rtt").stdout
    assert "switch ports (eBPF datapath" in status and "east-border0:eth" in status
    # A flow hash keeps each flow on one path: nothing arrives out of order.
    for mode in ("five-tuple", "qpn", "ev"):
        assert report[mode]["out_of_order"] == 0, report
    # five-tuple sees only 4 flows (one source port per pair): at most 4 of the 8 paths.
    assert report["five-tuple"]["paths_used"] <= 4, report
    # The QPN (or a per-QP entropy value) gives 64 flows: every path used, close to even.
    for mode in ("qpn", "ev"):
        assert report[mode]["paths_used"] == 8 and report[mode]["jain"] >= 0.8, report
    # Per-packet spraying is even, and reorders over unequal paths.
    assert report["qpn-psn"]["jain"] >= 0.95 and report["qpn-psn"]["out_of_order"] > 0, report
    if inconclusive:
        pytest.skip(f"the spread held, but no run of these modes was lossless on a quiet machine: {inconclusive}")


def overload_fabric(fabrics, tmp_path, name: str):
    """single-dc with a 32 KB switch buffer and WRED from 8 KB to 24 KB (32 MB, 8 MB and 24 MB at
    scale 0.001): (fabric name, plan, the host the overload targets, the leaf port into it)."""
    def edit(d):
        d["buffers"]["switch"] = "32MB"
        d["ecn"] = {"kmin": "8MB", "kmax": "24MB", "pmax": "20%"}

    topo = custom_topology(tmp_path, "single-dc", edit)
    name = fabrics(name, topo)
    p = plan.build(spec.load(topo), name)
    dst = "local-host2"
    return name, p, dst, next(x for x in p.ports() if x.peer_node == dst)


def test_overload_depth_matches_qdisc_backlog_marks_ect_and_qdisc_never_drops(fabrics, tmp_path):
    """Two hosts send at their NICs' line rate into a third host's port (2:1 overload).

    The switch buffer is 32 KB (32 MB at scale 0.001), WRED marks from 8 KB to 24 KB. Paced
    traffic at half the rate first: no queue, no marks. Then the incast: the port's true depth
    (enqueued - dequeued, from the maps) must bracket the qdisc's own backlog while it is
    full, ECT packets get CE, the egress program tail-drops at the buffer, the qdisc drops
    nothing.
    """
    name, p, dst, bottleneck = overload_fabric(fabrics, tmp_path, "tovl")
    key = (bottleneck.node, bottleneck.ifname)
    addr = str(p.host_address(dst))
    buffer = bottleneck.egress.buffer_bytes
    assert buffer == 32_000

    # Paced at half the port's rate (400 Mbps / 4.2 KB frames ~ 11.9k pps).
    before = port_counters(stats(name))[key]  # also starts the fidelity guard's interval
    r = start_receiver(name, dst, 4)
    # One socket for all QPs with a send buffer of about two frames: the sender blocks while its
    # NIC queue is busy, so its own 16 KB NIC buffer never overflows when Python's pacing
    # catches up in a burst.
    s = rocegen(name, "local-host0", "send", addr, "--qps", "4", "--packets", "1000", "--payload", "4096",
                "--pps", "6000", "--sndbuf", "4096", "--sport", "pair")
    got = finish(r, expect=finish(s)["sent"])
    body = stats(name)
    after = port_counters(body)[key]
    marks = after["counters"]["ecn_marks"] - before["counters"]["ecn_marks"]
    inconclusive = []
    if body["fidelity"]["trustworthy"]:
        assert got["packets"] == 4000 and got["ce"] == 0 and marks == 0, (got, marks)
    else:
        # A stalled CPU turns into backlog in the veth rings, which the depth counts: then the
        # paced run proves nothing either way (the guard says why).
        inconclusive = body["fidelity"]["limits"]

    # The incast: a host on the same leaf and one on another leaf, so that only the leaf's port to
    # the receiver carries both (ECMP could otherwise put both on one uplink). Tail drops may
    # take a QP's last packet: the receiver is told what was sent and stops 2 s after.
    before = after
    r = start_receiver(name, dst, 8)
    senders = [rocegen(name, f"local-host{i}", "send", addr, "--qps", "4", "--packets", "2500", "--payload",
                       "4096", "--sndbuf", "4096", "--sport", "pair", "--pair-id", str(i), "--gate") for i in (0, 3)]
    start_together(senders)
    samples = []
    verdict_of = watch(name)
    while any(x.poll() is None for x in senders):
        q = client.request(name, {"op": "queue", "node": key[0], "ifname": key[1]})
        samples.append((q["depth_before"], q["backlog"], q["depth_after"]))
    sent = sum(finish(x)["sent"] for x in senders)
    steal = stolen(verdict_of())
    got = finish(r, expect=sent)
    body = stats(name)
    after = port_counters(body)[key]
    delta = {k: after["counters"][k] - before["counters"][k] for k in after["counters"]}
    qdisc_drops = after["qdisc"]["drops"] - before["qdisc"]["drops"]
    full = [s for s in samples if s[1] > 8_000]

    def within(s, frames):
        return min(s[0], s[2]) - frames * FRAME <= s[1] <= max(s[0], s[2]) + frames * FRAME

    # The maps count a frame as dequeued when the peer's tc ingress sees it, a backlog round
    # after the qdisc released it: frames waiting in the CPU's backlog (more of them when the CPUs
    # are busy) stand between the two. Measured here: 95-99% of samples within one frame, the rest
    # within three.
    agree = [s for s in full if within(s, 1)]
    near = [s for s in full if within(s, 4)]
    print(f"incast: {len(samples)} samples, {len(full)} with the queue above kmin, {len(agree)} agree within a frame, "
          f"{len(near)} within four; "
          f"max depth {after['queue']['max_depth_bytes']} of {buffer}; marks {delta['ecn_marks']}, "
          f"buffer drops {delta['drop_buffer']}, qdisc drops {qdisc_drops}; receiver CE {got['ce']}/{got['packets']}")
    assert qdisc_drops == 0
    assert delta["drop_buffer"] > 0 and delta["ecn_marks"] > 0 and got["ce"] > 0
    assert after["queue"]["max_depth_bytes"] <= buffer
    assert len(full) >= 5, f"the queue was seen full in only {len(full)} of {len(samples)} samples"
    assert len(agree) >= 0.9 * len(full), [s for s in full if s not in agree][:5]
    if len(near) < len(full) and steal:
        # A vCPU stolen mid-reading leaves frames in the peer's veth ring for longer.
        inconclusive.append(f"{len(full) - len(near)} of {len(full)} samples beyond four frames while "
                            f"{steal}: {[s for s in full if s not in near][:5]}")
    else:
        assert len(near) == len(full), [s for s in full if s not in near][:5]
    if inconclusive:
        pytest.skip(f"every other check passed; inconclusive on this loaded machine: {inconclusive}")


def test_overloaded_port_dequeues_back_to_back_at_its_rate(fabrics, tmp_path):
    """Mininet-HiFi's fidelity check on the 2:1 incast above: while the port was backlogged,
    the peer's tc ingress saw frames leave its queue one transmission time apart.

    The primary check is the rate achieved over the busy gaps (bytes the shaper charged to them
    / their time): within 10% of the port's configured rate. Single gaps jitter with the
    shaper's timer, and HTB's burst allowance (queues._burst: two frames here) lets a late
    frame's successor leave early to catch up, so the bins only have to show most gaps
    around 1.0. Measured on a quiet 2-core machine (16 runs): 0.998-1.000 of the rate, 70-93%
    of the gaps in 0.9-1.1, the rest split evenly between 0.75-0.9 and 1.1-1.25 (a late gap
    paid back by an early one), under 1% below 0.5 and under 0.5% above 2.
    """
    name, p, dst, bottleneck = overload_fabric(fabrics, tmp_path, "tpace")
    rate = bottleneck.egress.rate_bps / 8
    where = {"node": bottleneck.node, "ifname": bottleneck.ifname}
    before = client.request(name, {"op": "pacing", **where})["pacing"]
    addr = str(p.host_address(dst))
    r = start_receiver(name, dst, 8)
    verdict_of = watch(name)
    senders = [rocegen(name, f"local-host{i}", "send", addr, "--qps", "4", "--packets", "5000", "--payload",
                       "4096", "--sndbuf", "4096", "--sport", "pair", "--pair-id", str(i), "--gate") for i in (0, 3)]
    start_together(senders)
    sent = sum(finish(x)["sent"] for x in senders)
    verdict = verdict_of()
    steal = stolen(verdict)
    finish(r, expect=sent)
    after = client.request(name, {"op": "pacing", **where})["pacing"]
    counts = [a - b for a, b in zip(after["counts"], before["counts"])]
    gaps = after["busy_gaps"] - before["busy_gaps"]
    busy_ns = after["busy_ns"] - before["busy_ns"]
    busy_bytes = after["busy_bytes"] - before["busy_bytes"]
    achieved = busy_bytes / (busy_ns / 1e9) / rate if busy_ns else 0.0
    edges = after["edges"]
    on_time = next(i for i, e in enumerate(edges) if e > 1.0)  # the bin that holds a ratio of 1
    bins = ", ".join(f"{lo}-{hi}: {c / max(gaps, 1):.1%}"
                     for lo, hi, c in zip([0.0, *edges], [*edges, "inf"], counts))
    seen = (f"{gaps} busy gaps over {busy_ns / 1e9:.3f} s at {achieved:.4f} of the port's rate "
            f"({rate * 8 / 1e6:.0f} Mb/s), monitor {verdict['limits']}; gap / ideal: {bins}")
    print(f"pacing of {bottleneck.node}:{bottleneck.ifname}: {seen}")
    assert gaps >= 2000, f"the incast hardly kept the port backlogged: {seen}"
    faithful = abs(achieved - 1) <= 0.10 and counts[on_time] >= 0.5 * gaps
    if not faithful and steal:
        pytest.skip(f"inconclusive: the fidelity monitor saw the hypervisor steal CPU (a stolen vCPU stalls "
                    f"the shaper): {seen}")
    assert abs(achieved - 1) <= 0.10, f"the backlogged port did not deliver its rate: {seen}"
    window = f"{edges[on_time - 1]}-{edges[on_time]}"
    assert counts[on_time] >= 0.5 * gaps, f"most busy gaps must be one frame time ({window}): {seen}"


def test_fidelity_guard_reports_drops_outside_the_model(fabrics):
    """A receiver that never reads overflows its socket: the figures of that interval are then
    flagged as not trustworthy, naming the host."""
    name = fabrics("tfid", "tiny", "--no-wan-delay")
    p = plan.build(spec.load(TOPOLOGIES / "tiny.yaml"), name)
    stats(name)  # the guard's first reading: what follows is judged against it
    sink = netns.popen(p.netns("west-host0"), [sys.executable, "-c", (
        "import socket, sys\n"
        "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        "s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)\n"
        "s.bind(('0.0.0.0', 4791))\n"
        "print('ready', flush=True)\n"
        "sys.stdin.read()\n")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert sink.stdout.readline().strip() == "ready"
        finish(rocegen(name, "east-host0", "send", str(p.host_address("west-host0")), "--qps", "1",
                       "--packets", "200", "--payload", "1024", "--pps", "2000"))
        verdict = stats(name)["fidelity"]
    finally:
        sink.communicate("", timeout=30)
    assert not verdict["trustworthy"]
    assert any("receive socket overflows on west-host0" in limit for limit in verdict["limits"]), verdict
