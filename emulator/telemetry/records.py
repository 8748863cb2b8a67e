"""Records that cross a process or a socket as JSON, each with named fields: what the controller
answers a "sample" with, read by the report and the model check in the CLI's process."""
from __future__ import annotations

from dataclasses import asdict, dataclass


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
class PortSample:
    """Every switch port at one moment (``t``: CLOCK_MONOTONIC, one clock for every namespace)."""

    t: float
    ports: list[PortReading]

    def as_dict(self) -> dict:
        return {"t": self.t, "ports": [p.as_dict() for p in self.ports]}

    @classmethod
    def from_dict(cls, d: dict) -> "PortSample":
        return cls(d["t"], [PortReading(**p) for p in d["ports"]])
