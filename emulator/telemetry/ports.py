"""Per-port figures of a running fabric, read from the datapath's maps and the kernel.

For every port: what the eBPF datapath counted (forwarded, marked, dropped and why), the true
queue depth (enqueued - dequeued bytes) now and at its deepest, and what the kernel itself
reports (qdisc backlog and drops, veth drops) so the two can be held against each other.

The fidelity guard lives here too: an emulator that runs out of CPU produces fiction (queues
that are really softirq backlog, drops the topology never configured). Between two readings it
looks for softirq saturation, drops outside the modelled buffers (qdiscs the datapath keeps
from dropping, veths, receiving sockets) and says which limit was hit and what would fit.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from emulator.fabric import netns, queues
from emulator.model.plan import Port, Shaping, SWITCH_ROLES
from emulator.model.timemodel import TimeModel
from emulator.telemetry import cpu, fidelity
from emulator.telemetry.cpu import STEAL_LIMIT

if TYPE_CHECKING:
    from emulator.fabric.build import Fabric

# Share of all CPU time spent in softirq above which packet processing is the bottleneck.
SOFTIRQ_SATURATED = 0.85
# Share of the time some runnable task waited for a CPU (PSI) above which senders were likely
# held back while their links sat idle.
CPU_PRESSURE_LIMIT = 0.5
PSI_CPU = "/proc/pressure/cpu"


def _cpu_pressure_us() -> int | None:
    """Total microseconds some task waited for a CPU (PSI), or None without PSI."""
    try:
        with open(PSI_CPU) as fh:
            some = fh.readline().split()
    except OSError:
        return None
    return int(some[-1].split("=")[1])


def _link_drops(ipr, index: int) -> dict[str, int]:
    link = ipr.get_links(index)[0]
    s = link.get_attr("IFLA_STATS64") or {}
    return {"rx_dropped": s.get("rx_dropped", 0), "tx_dropped": s.get("tx_dropped", 0)}


def netdev_packets(pid: int) -> dict[str, dict[str, int]]:
    """The kernel's packet counts of every interface of the namespace process ``pid`` is in, from
    its /proc/PID/net/dev: ifname -> counts. A file read, a few microseconds, against a netlink
    dump's parse of every attribute (most of a millisecond)."""
    out = {}
    with open(f"/proc/{pid}/net/dev") as f:
        for line in f.readlines()[2:]:  # two header lines
            name, _, fields = line.partition(":")
            v = fields.split()
            out[name.strip()] = {"rx_bytes": int(v[0]), "rx_packets": int(v[1]), "tx_bytes": int(v[8]),
                                 "tx_packets": int(v[9])}
    return out


def link_packets(ipr, index: int) -> dict[str, int]:
    """The kernel's own count of what crossed the interface (independent of the datapath's)."""
    s = ipr.get_links(index)[0].get_attr("IFLA_STATS64") or {}
    return {k: s.get(k, 0) for k in ("rx_packets", "tx_packets", "rx_bytes", "tx_bytes")}


def port_stats(f: "Fabric", port: Port) -> dict:
    plan = f.plan
    node = f.nodes[port.node]
    role = plan.node(port.node).role
    out: dict = {"node": port.node, "ifname": port.ifname, "ifindex": port.ifindex, "role": role,
                 "peer": f"{port.peer_node}:{port.peer_ifname}"}
    link = next((l for l in plan.links if port in (l.a, l.b)), None)
    if link is not None and link.kind == "wan" and role in SWITCH_ROLES:
        out["wan_path"] = link.path
    egress = port.egress
    out["rate_bps"] = getattr(egress, "rate_bps", None)
    out["buffer_bytes"] = getattr(egress, "buffer_bytes", None)
    try:
        out["qdisc"] = queues.counters(node.ipr, port.ifindex)
    except Exception:  # noqa: BLE001 - a port without a root qdisc (fibers without delay)
        out["qdisc"] = None
    out["link"] = _link_drops(node.ipr, port.ifindex)
    if role == "fiber":
        out["fiber_path"] = plan.node(port.node).index
        out["kernel"] = link_packets(node.ipr, port.ifindex)
    dp = f.datapath
    if dp is not None:
        out["counters"] = dp.counters(port.ifindex)
        if role in SWITCH_ROLES:
            q = dp.queue(port.ifindex)
            out["queue"] = {"depth_bytes": q["depth"], "max_depth_bytes": q["max_depth"],
                            "enqueued_bytes": q["enq_bytes"], "dequeued_bytes": q["deq_bytes"]}
        if plan.pfc_port(port):
            out["pfc"] = pfc_stats(f, port)
    return out


def pfc_stats(f: "Fabric", port: Port) -> dict:
    """PFC on one port, per lossless priority: frames sent (requests) and received
    (indications), headroom drops, the ingress occupancy that decides XOFF, and how long the
    port's own egress stayed paused (wall seconds)."""
    dp, spec = f.datapath, f.plan.spec
    agent = dp.pfc
    out = {}
    for prio in spec.pfc.lossless:
        row = dp.pfc_counters(port.ifindex, prio)
        ingress = dp.ingress(port.ifindex, prio)
        row.update(ingress_bytes=ingress["bytes"], ingress_max_bytes=ingress["max_bytes"],
                   xoff=ingress["paused"], paused_s=agent.paused_s(port.ifindex, prio) if agent else 0.0,
                   paused_now=agent.shut(port.ifindex, prio) if agent else False,
                   headroom_bytes=dp.port_entry(port.ifindex).headroom)
        out[str(prio)] = row
    return out


def _receive_overflows(ns: str) -> int:
    """Datagrams the namespace's sockets had no room for: UDP's RcvbufErrors, and the drops of
    its raw sockets (the soft-NIC reads through one; /proc/net/raw's last column)."""
    with netns.entered(ns):
        with open("/proc/net/snmp") as fh:
            lines = [l.split() for l in fh if l.startswith("Udp:")]
        with open("/proc/net/raw") as fh:
            raw = [l.split() for l in fh.readlines()[1:]]
    head, vals = lines[0], lines[1]
    return int(vals[head.index("RcvbufErrors")]) + sum(int(r[-1]) for r in raw if r)


@dataclass
class Snapshot:
    at: float
    softirq: int
    steal: int
    total: int
    drops: dict[str, int] = field(default_factory=dict)  # "what where" -> count
    cpu_wait_us: int | None = None  # PSI "some" total for the CPU
    # Switch port -> (its egress rate in emulated bit/s, the datapath's dequeue pacing counters).
    pacing: dict[str, tuple[int, dict]] = field(default_factory=dict)


def pacing_delta(prev: dict, now: dict) -> dict:
    """Dequeue pacing counters between two readings."""
    return {"edges": now["edges"], "counts": [b - a for a, b in zip(prev["counts"], now["counts"])],
            "busy_gaps": now["busy_gaps"] - prev["busy_gaps"], "busy_ns": now["busy_ns"] - prev["busy_ns"],
            "busy_bytes": now["busy_bytes"] - prev["busy_bytes"]}


def assess(prev: Snapshot, now: Snapshot, tm: TimeModel) -> dict:
    """What went beyond the model between two snapshots: {"trustworthy", "limits", "pacing", ...}.
    Every busy switch port's dequeue pacing (Mininet-HiFi's check) joins the machine's limits."""
    scale = tm.scale
    limits = []
    total = now.total - prev.total
    share = (now.softirq - prev.softirq) / total if total > 0 else 0.0
    steal = (now.steal - prev.steal) / total if total > 0 else 0.0
    seconds = now.at - prev.at
    if share >= SOFTIRQ_SATURATED:
        limits.append(f"softirq took {share:.0%} of all CPU time over {seconds:.1f} s: packet processing is "
                      f"out of CPU, so queues and drops include the machine's own backlog; lower the offered "
                      f"load or the scale (about {scale * SOFTIRQ_SATURATED / share / 2:g} instead of "
                      f"{scale:g} would fit)")
    if now.cpu_wait_us is not None and prev.cpu_wait_us is not None and seconds > 0:
        waited = (now.cpu_wait_us - prev.cpu_wait_us) / (seconds * 1e6)
        if waited >= CPU_PRESSURE_LIMIT:
            limits.append(f"runnable processes waited for a CPU {waited:.0%} of the last {seconds:.1f} s: "
                          "senders were held back while their links may have been idle; lower the load")
    if steal >= STEAL_LIMIT:
        limits.append(f"the hypervisor stole {steal:.0%} of the CPU time over {seconds:.1f} s: shapers and "
                      "senders stalled with it; rerun on a quieter machine")
    for what, count in now.drops.items():
        delta = count - prev.drops.get(what, 0)
        if delta > 0:
            limits.append(f"{delta} {what}: outside the modelled buffers")
    pacing = []
    for port, (rate, counters) in now.pacing.items():
        if port not in prev.pacing:
            continue
        finding = fidelity.dequeue_pacing(port, tm, pacing_delta(prev.pacing[port][1], counters), rate, seconds)
        if finding is not None:
            pacing.append(finding.as_dict())
            if not finding.ok:
                limits.append(finding.message)
    return {"trustworthy": not limits, "limits": limits, "softirq_share": share, "steal_share": steal,
            "interval_s": seconds, "pacing": pacing}


class FidelityGuard:
    """Compares successive readings and says when the figures stop being trustworthy."""

    def __init__(self, f: "Fabric") -> None:
        self.fabric = f
        self.last = self._snapshot()

    def _snapshot(self) -> Snapshot:
        f = self.fabric
        plan = f.plan
        times = cpu.read()
        drops: dict[str, int] = {}
        for port in plan.ports():
            node = f.nodes[port.node]
            where = f"{port.node}:{port.ifname}"
            link = _link_drops(node.ipr, port.ifindex)
            drops[f"veth drops on {where}"] = link["rx_dropped"] + link["tx_dropped"]
            if f.datapath is not None and plan.node(port.node).role in SWITCH_ROLES:
                # The egress program tail-drops below the qdisc's limit: a qdisc drop here is
                # one the modelled buffer did not make.
                drops[f"qdisc drops on {where} (the datapath keeps this qdisc from dropping)"] = \
                    queues.counters(node.ipr, port.ifindex)["drops"]
        for n in plan.by_role("host"):
            drops[f"receive socket overflows on {n.name}"] = _receive_overflows(plan.netns(n.name))
        pacing = {}
        if f.datapath is not None:
            for port in plan.ports():
                if plan.node(port.node).role in SWITCH_ROLES and isinstance(port.egress, Shaping):
                    pacing[f"{port.node}:{port.ifname}"] = (port.egress.rate_bps, f.datapath.pacing(port.ifindex))
        return Snapshot(time.monotonic(), times.softirq, times.steal, times.total, drops, _cpu_pressure_us(), pacing)

    def check(self) -> dict:
        """Findings since the previous check."""
        now = self._snapshot()
        prev, self.last = self.last, now
        return assess(prev, now, self.fabric.plan.spec.time)

    def mark(self) -> Snapshot:
        """A snapshot to assess a run against later (``since``), apart from ``check``'s."""
        return self._snapshot()

    def since(self, mark: Snapshot) -> dict:
        return assess(mark, self._snapshot(), self.fabric.plan.spec.time)
