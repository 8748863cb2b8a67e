"""Records that cross a process or a socket as JSON, each with named fields: what the controller
answers a "sample" with, read by the report and the model check in the CLI's process."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class PortReading:
    """One switch port's datapath figures at a sample: bytes queued now, and running totals."""

    port: str  # "node:ifname"
    depth: int  # bytes queued on its egress
    deq_bytes: int  # bytes dequeued since the datapath was loaded
    ecn_marks: int  # packets marked CE on enqueue
    drops: int  # packets tail-dropped by the modelled buffer
    # With PFC (zero without): the priorities whose egress is paused now (bit p: priority p),
    # PFC frames with a pause time this port sent upstream, and lossless packets dropped
    # (headroom overrun, the watchdog's TX and RX drops).
    paused: int = 0
    pauses_sent: int = 0
    lossless_drops: int = 0
    # Packets it sent or received while down (a fault: a cut fiber, a failed switch).
    down_drops: int = 0

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class PathReading:
    """A border's port onto a long-haul path at a sample: its share of the ECMP groups it serves
    now (weights and withdrawals applied), and the fiber's own kernel count of the packets it
    carried on from that border (independent of the datapath's counters)."""

    port: str  # the border's "node:ifname"
    path: int
    share: float
    fiber_packets: int  # tx packets of the fiber's port towards the far border

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class PortSample:
    """Every switch port at one moment (``t``: CLOCK_MONOTONIC, one clock for every namespace),
    and the long-haul paths seen from the borders."""

    t: float
    ports: list[PortReading]
    paths: list[PathReading] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"t": self.t, "ports": [p.as_dict() for p in self.ports], "paths": [p.as_dict() for p in self.paths]}

    @classmethod
    def from_dict(cls, d: dict) -> "PortSample":
        return cls(d["t"], [PortReading(**p) for p in d["ports"]], [PathReading(**p) for p in d.get("paths", [])])
