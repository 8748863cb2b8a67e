"""This machine's CPU time from /proc/stat, and the one threshold of hypervisor steal above which
a run's timing figures are not the fabric's: a stolen vCPU stalls shapers' timers, the NICs'
loops and the instruments alike, so the figures understate what the fabric would do."""
from __future__ import annotations

from dataclasses import dataclass, fields

# Steal above this share of CPU time makes a run's timing untrustworthy (the fidelity guard says
# so, tests call a load-sensitive bound inconclusive rather than failed, measurements warn): a
# 2-core machine losing 3% loses a core for tens of milliseconds at a time, seen to stall shapers.
STEAL_LIMIT = 0.03


@dataclass(frozen=True)
class CpuTimes:
    """Jiffies of all CPUs together since boot, by kind (the first eight of /proc/stat's cpu line)."""

    user: int
    nice: int
    system: int
    idle: int
    iowait: int
    irq: int
    softirq: int
    steal: int

    @property
    def total(self) -> int:
        return sum(getattr(self, f.name) for f in fields(self))

    @property
    def busy(self) -> int:
        """Everything but idle and waiting for I/O."""
        return self.total - self.idle - self.iowait


def read() -> CpuTimes:
    with open("/proc/stat") as fh:
        return CpuTimes(*(int(v) for v in fh.readline().split()[1:9]))


def share(before: CpuTimes, after: CpuTimes, kind: str) -> float:
    """The share of all CPU time between two readings spent in ``kind`` (e.g. "steal")."""
    total = after.total - before.total
    return (getattr(after, kind) - getattr(before, kind)) / total if total > 0 else 0.0


class CpuWatch:
    """Share of CPU time the hypervisor stole while something ran, from construction to steal()."""

    def __init__(self) -> None:
        self.start = read()

    def steal(self) -> float:
        return share(self.start, read(), "steal")
