"""PFC's numbers, computed and checked: headroom per link, pause quanta, what is refused.

Pure: a FabricSpec in, figures out. Headroom follows the SONiC/Mellanox buffer calculation:
what still arrives at a port after its ingress crossed XOFF is the frames already being
serialised, the bytes on the cable both ways (the PAUSE travels up while data travels down),
and what the upstream takes to react. Here the reaction includes the emulator's own: XOFF
crossed in the kernel, the agent woken, the PAUSE sent, the upstream's agent woken and its
gate closed, measured by bench/pfc.py and counted in real time as wall / dilation.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from emulator.model import units

if TYPE_CHECKING:
    from emulator.model.spec import FabricSpec

ETH_HEADER = 14
# A PAUSE quantum is 512 bit times of the link (IEEE 802.1Q 36.1.3.1); XOFF asks for the most.
QUANTUM_BITS = 512
XOFF_QUANTA = 0xFFFF
# The emulator's own pause reaction, wall seconds, from XOFF crossed to the upstream gate shut:
# bench/pfc.py measures it (two ring-buffer wake-ups of the agent, one PAUSE sent, one netlink
# change, and the softirq backlog of a loaded machine between them); its tail reached 60 ms on
# a 2-core machine under an 8-into-1 incast at faithful (15 us of the real fabric's time).
EMULATOR_REACTION_S = 0.1
# Frames that still arrive at any reaction time: the one the upstream is serialising when the
# PAUSE lands, the one this port's egress is sending ahead of the PAUSE (which then goes next,
# in the never-paused control class), and the one the gate lets out when it closes (TBF fills
# its bucket on every change).
FRAMES_IN_FLIGHT = 3


@dataclass(frozen=True)
class Headroom:
    """One link's headroom, real bytes, with its parts (what `status` shows)."""

    link: str  # host | fabric | border
    rate_bps: int  # real
    frames: int  # FRAMES_IN_FLIGHT full frames
    cable: int  # bytes on the cable, both ways
    response: int  # bytes sent while the upstream reacts (switch + emulator)
    response_s: float  # that reaction, real seconds

    @property
    def total(self) -> int:
        return self.frames + self.cable + self.response

    def as_dict(self) -> dict:
        return {"link": self.link, "rate_bps": self.rate_bps, "frames": self.frames, "cable": self.cable,
                "response": self.response, "response_s": self.response_s, "total": self.total}


def link_rate(spec: "FabricSpec", kind: str) -> int:
    return {"host": spec.links.host, "fabric": spec.links.fabric, "border": spec.links.border}[kind]


def headroom(spec: "FabricSpec", kind: str, reaction_wall_s: float = EMULATOR_REACTION_S) -> Headroom:
    """The headroom a port on a ``kind`` link needs, real bytes."""
    rate = link_rate(spec, kind)
    per_s = rate / 8
    cable_s = units.fiber_delay(spec.latency.cable_m)
    response_s = spec.latency.switch_s + spec.time.real_time(reaction_wall_s)
    return Headroom(kind, rate, FRAMES_IN_FLIGHT * (spec.mtu + ETH_HEADER), round(2 * per_s * cable_s),
                    round(per_s * response_s), response_s)


def needed(spec: "FabricSpec") -> dict[str, Headroom]:
    """Headroom per link kind that carries PFC (the long-haul paths do not)."""
    return {kind: headroom(spec, kind) for kind in ("host", "fabric", "border")}


def reserved(spec: "FabricSpec", kind: str) -> int:
    """Real bytes a port on a ``kind`` link reserves: the topology's ``pfc.headroom``, or the need."""
    return spec.pfc.headroom if spec.pfc.headroom is not None else headroom(spec, kind).total


def quantum_s(spec: "FabricSpec", kind: str) -> float:
    """Wall seconds of one pause quantum on a ``kind`` link: 512 bit times of the real link,
    dilated (at d = 1/s exactly 512 bit times of the emulated rate)."""
    return spec.time.time(QUANTUM_BITS / link_rate(spec, kind))


def long_haul_headroom(spec: "FabricSpec") -> tuple[int, float, int]:
    """(real bytes, RTT s, rate) a lossless long-haul port would need: its rate x the RTT."""
    worst = max(spec.wan_paths, key=lambda p: p.rate_bps * p.delay_s)
    rtt = 2 * worst.delay_s
    return round(worst.rate_bps / 8 * rtt), rtt, worst.rate_bps


def problems(spec: "FabricSpec") -> list[tuple[str, str]]:
    """What makes the topology's PFC impossible, as (key path, why with the figure)."""
    out: list[tuple[str, str]] = []
    pfc = spec.pfc
    if not pfc.enabled:
        return out
    if spec.shaper != "htb":
        out.append(("shaper", "PFC gates each priority of an egress under its own HTB class: use shaper: htb"))
    if pfc.long_haul and spec.wan_paths:
        need, rtt, rate = long_haul_headroom(spec)
        out.append(("pfc.long_haul", f"lossless across a long-haul path needs headroom of its rate x RTT, "
                                     f"{units.format_rate(rate)} x {units.format_duration(rtt)} = "
                                     f"{units.format_size(need)} per port, against {units.format_size(spec.buffers.border)} "
                                     "of border buffer; leave the WAN-facing ports lossy (deep-buffered), "
                                     "as production fabrics do"))
    for kind, need in sorted(needed(spec).items(), key=lambda kv: -kv[1].total):
        have = reserved(spec, kind)
        if have < need.total:
            out.append(("pfc.headroom", f"{units.format_size(have)} cannot hold what arrives on a "
                                        f"{units.format_rate(need.rate_bps)} {kind} link while PAUSE takes effect: "
                                        f"{units.format_size(need.total)} ({need.frames} B of frames, {need.cable} B "
                                        f"on the cable, {need.response} B in a "
                                        f"{units.format_duration(need.response_s)} reaction)"))
            break
        buffer = spec.buffers.host if kind == "host" else spec.buffers.switch
        if pfc.xoff + have > buffer:
            out.append(("pfc.xoff", f"XOFF {units.format_size(pfc.xoff)} + headroom {units.format_size(have)} "
                                    f"on a {kind} link exceed the {units.format_size(buffer)} port buffer "
                                    f"(the reaction, {units.format_duration(need.response_s)} real at "
                                    f"{spec.time.name}, takes {units.format_size(need.response)}); "
                                    "run at dilation: faithful, or lower pfc.xoff"))
            break
    return out
