"""What the orchestrator and the soft-NIC workers say to each other, one JSON line each: the
workers' ``ready`` (their QPs, as verbs applications exchange them out of band) and
``result`` messages, as named records. The orchestrator keeps them as dicts in the
TransferResult (``as_dict``), which is what --json prints and the report reads."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class QpEndpoint:
    """One side of a QP, as its peer must know it to connect."""

    qpn: int
    psn: int  # the first PSN it sends
    sack: bool = False  # it offers the selective-repeat extension (nic/rc.py)


@dataclass(frozen=True)
class FlowEndpoint:
    """The target's side of one sender's flow: its QPs and the region the sender writes into."""

    qps: list[QpEndpoint]
    rkey: int
    va: int

    @classmethod
    def from_dict(cls, d: dict) -> "FlowEndpoint":
        return cls([QpEndpoint(**q) for q in d["qps"]], d["rkey"], d["va"])


@dataclass(frozen=True)
class SenderReady:
    qps: list[QpEndpoint]

    @classmethod
    def from_dict(cls, d: dict) -> "SenderReady":
        return cls([QpEndpoint(**q) for q in d["qps"]])


@dataclass(frozen=True)
class TargetReady:
    flows: list[FlowEndpoint]  # one per sender, in the order of --peer

    @classmethod
    def from_dict(cls, d: dict) -> "TargetReady":
        return cls([FlowEndpoint.from_dict(f) for f in d["flows"]])


@dataclass(frozen=True)
class SendersReady:
    """What the target is told: each sender's QPs, in the order of its --peer."""

    senders: list[SenderReady]

    @classmethod
    def from_dict(cls, d: dict) -> "SendersReady":
        return cls([SenderReady.from_dict(s) for s in d["senders"]])


@dataclass(frozen=True)
class QpFigures:
    """A QP's counters at the end; times in wall seconds, like every time the workers report."""

    qpn: int
    data_packets: int
    retransmits: int
    timeouts: int
    acks_received: int
    naks_received: int
    delivered: int
    held: int
    naks_sent: int
    acks_sent: int
    cnps_received: int
    cnps_sent: int
    srtt_s: float | None
    rto_s: float
    max_inflight: int
    dropped: dict[str, int]
    error: str | None
    completed_s: float | None  # from the worker's start to the QP's last completion


@dataclass(frozen=True)
class SenderResult:
    complete: bool
    sha256: str  # of the data it sent
    seconds: float  # from its start to its last completion
    bytes: int
    started_s: float  # its start on the orchestrator's clock (from t0)
    goodput_bps: float
    failed: list[dict]  # work completions in error (at most 20): qpn, wr_id, status
    nic: dict  # SoftNic.stats()
    telemetry: dict  # the Recorder's series
    qps: list[QpFigures] = field(default_factory=list)
    # CPU seconds the process ran from its start to its last completion (CLOCK_PROCESS_CPUTIME_ID:
    # the kernel's work done in its context counts, the forwarding of what it sends included).
    cpu_s: float = 0.0

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "SenderResult":
        return cls(**{**d, "qps": [QpFigures(**q) for q in d["qps"]]})


@dataclass(frozen=True)
class TargetResult:
    complete: bool
    sha256: list[str]  # of each sender's region, in the order of --peer
    nic: dict
    telemetry: dict
    qps: list[QpFigures] = field(default_factory=list)
    cpu_s: float = 0.0  # CPU seconds it ran from its start to its last completion (as SenderResult's)

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "TargetResult":
        return cls(**{**d, "qps": [QpFigures(**q) for q in d["qps"]]})
