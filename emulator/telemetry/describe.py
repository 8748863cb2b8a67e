"""The status of a running fabric, read back from the kernel and measured now.

Nothing here repeats the plan without checking it: rates, buffers and delay lines are read from
the qdiscs that are installed, and RTTs come from pings sent when status is asked for.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from emulator.errors import MeasurementError
from emulator.fabric import capabilities, queues
from emulator.model.plan import DelayLine, FabricPlan, MIN_NETEM_DELAY_S, Port, Shaping
from emulator.telemetry import measure

if TYPE_CHECKING:
    from emulator.fabric.build import Fabric

NO_DELAY_WARNING = "NO WAN DELAY: started with --no-wan-delay; long-haul paths have no propagation delay"


def rtt_pairs(plan: FabricPlan) -> list[tuple[str, str, str]]:
    """(scope, src, dst): one host pair across the DCs, one within a DC across leaves."""
    pairs = []
    dcs = plan.spec.datacenters
    first = {dc.name: f"{dc.name}-host0" for dc in dcs}
    if len(dcs) == 2:
        pairs.append(("cross-dc", first[dcs[0].name], first[dcs[1].name]))
    dc = dcs[0]
    if dc.leaves > 1:
        pairs.append(("intra-dc", first[dc.name], f"{dc.name}-host{dc.hosts_per_leaf}"))
    elif dc.hosts_per_leaf > 1:
        pairs.append(("intra-leaf", first[dc.name], f"{dc.name}-host1"))
    return pairs


def expected_rtt(plan: FabricPlan, scope: str, wan_delay: bool, intra_delay: bool = False) -> float:
    """The propagation a ping should see, wall seconds: the dilated fibers across the DCs, and
    the dilated in-DC latency where the hosts' netem holds it."""
    out = 2 * plan.wan_delay_s() if scope == "cross-dc" and wan_delay else 0.0
    if intra_delay:
        out += 2 * plan.spec.emulated_time(plan.spec.intra_dc_one_way_s())
    return out


def _configured(egress: Shaping | DelayLine | None, wan_delay: bool) -> dict | None:
    if isinstance(egress, Shaping):
        return {"kind": egress.shaper, "rate_bps": egress.rate_bps, "real_rate_bps": egress.real_rate_bps,
                "buffer_bytes": egress.buffer_bytes, "real_buffer_bytes": egress.real_buffer_bytes,
                "qdisc_limit_bytes": egress.qdisc_limit, "delay_s": egress.delay_s}
    if isinstance(egress, DelayLine):
        if not wan_delay:
            return {"kind": "none", "note": NO_DELAY_WARNING}
        return {"kind": "netem", "delay_s": egress.delay_s, "loss": egress.loss,
                "corruption": egress.corruption, "limit_packets": egress.limit_packets}
    return None


def _port(fabric: "Fabric", port: Port) -> dict:
    node = fabric.nodes[port.node]
    index = node.ipr.link_lookup(ifname=port.ifname)[0]
    return {
        "node": port.node,
        "ifname": port.ifname,
        "mac": port.mac,
        "address": str(port.address) if port.address else None,
        "configured": _configured(port.egress, fabric.wan_delay),
        "kernel": queues.read(node.ipr, index),
    }


def ecn_thresholds(spec) -> dict:
    """The switches' ECN thresholds, real and emulated, with where each came from."""
    e = spec.ecn
    kmin, kmax, _ = spec.emulated_ecn()
    return {"kmin": e.kmin, "kmax": e.kmax, "pmax": e.pmax, "source": dict(zip(("kmin", "kmax", "pmax"), e.source)),
            "emulated_kmin": kmin, "emulated_kmax": kmax}


def fabric(f: "Fabric", measure_rtt: bool = True) -> dict:
    plan = f.plan
    spec = plan.spec
    out: dict = {
        "name": plan.name,
        "prefix": plan.prefix,
        "topology": spec.source,
        "scale": spec.scale,
        "time_model": spec.time.as_dict(),
        "mtu": spec.mtu,
        "wan_delay": f.wan_delay,
        "warnings": [NO_DELAY_WARNING] if spec.wan_paths and not f.wan_delay else [],
        "up_seconds": f.up_seconds,
        "nodes": [{"name": n.name, "role": n.role, "dc": n.dc, "netns": plan.netns(n.name)} for n in plan.nodes],
        "links": [],
        "wan_paths": [],
        "rtt": [],
    }
    for link in plan.links:
        out["links"].append({"kind": link.kind, "path": link.path, "a": _port(f, link.a), "b": _port(f, link.b)})
    for p in spec.wan_paths:
        out["wan_paths"].append({
            "index": p.index, "fiber": f"wan{p.index}", "distance_m": p.distance_m,
            "one_way_delay_s": p.delay_s if f.wan_delay else 0.0,
            "configured_one_way_delay_s": p.delay_s, "delay_emulated": f.wan_delay,
            "wall_one_way_delay_s": spec.emulated_time(p.delay_s) if f.wan_delay else 0.0,
            "real_rate_bps": p.rate_bps, "rate_bps": spec.emulated_rate(p.rate_bps),
            "loss": p.loss, "corruption": p.corruption, "ber": p.ber,
            # Who drops with that loss: the path's netem, or without delay lines the border's
            # eBPF egress (corruption needs netem).
            "loss_by": ("netem" if f.wan_delay else "ebpf" if spec.ecmp.datapath == "ebpf" else None)
            if p.loss else None,
        })
    one_way = spec.intra_dc_one_way_s()
    out["intra_dc"] = {"one_way_s": one_way, "rtt_s": 2 * one_way, "cable_m": spec.latency.cable_m,
                       "switch_s": spec.latency.switch_s, "applied": f.intra_delay,
                       "wall_one_way_s": spec.emulated_time(one_way),
                       # Why not, when it is not: what the report says next to the RTT it measured.
                       "not_applied_because": None if f.intra_delay else (
                           "this kernel has no sch_netem" if not capabilities.has_netem() else
                           f"{spec.emulated_time(one_way) * 1e6:.3g} us of wall time is below the emulator's own "
                           f"forwarding ({MIN_NETEM_DELAY_S * 1e6:g} us)")}
    out["datapath"] = spec.ecmp.datapath
    out["datapath_build"] = f.datapath.build if f.datapath is not None else None
    out["congestion"] = {"dcqcn": spec.nic.dcqcn, "dcqcn_overrides": dict(spec.nic.dcqcn_overrides),
                         "ecn": ecn_thresholds(spec)}
    out["pfc"] = pfc_summary(f)
    if f.datapath is not None:
        from emulator.telemetry import ports as telemetry

        out["ports"] = [telemetry.port_stats(f, p) for p in plan.ports()]
    if measure_rtt:
        for scope, src, dst in rtt_pairs(plan):
            entry = {"scope": scope, "expected_s": expected_rtt(plan, scope, f.wan_delay, f.intra_delay)}
            try:
                entry.update(measure.rtt(plan, src, dst).as_dict())
            except MeasurementError as e:
                entry.update(src=src, dst=dst, error=str(e))
            out["rtt"].append(entry)
    return out


def pfc_summary(f: "Fabric") -> dict:
    """PFC as the fabric runs it: thresholds, the headroom each link reserves and what it is
    made of, and the agent's measured reaction against the one the headroom assumes."""
    from emulator.model import pfc as pfc_model

    spec = f.plan.spec
    if not spec.pfc.enabled:
        return {"enabled": False}
    out = {"enabled": True, "priority": spec.pfc.priority, "xoff": spec.pfc.xoff, "xon": spec.pfc.xon,
           "headroom": {k: dict(h.as_dict(), reserved=pfc_model.reserved(spec, k))
                        for k, h in pfc_model.needed(spec).items()},
           "assumed_reaction_s": pfc_model.EMULATOR_REACTION_S, "long_haul": "lossy (WAN-facing border ports)"}
    agent = f.datapath.pfc if f.datapath is not None else None
    if agent is not None:
        out["agent"] = agent.summary()
    return out
