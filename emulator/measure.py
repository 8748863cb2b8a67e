"""Measurements on a running fabric: RTT with ping, link rate with the UDP blaster.

Every figure comes from packets that crossed the fabric now; a measurement that cannot be made
raises MeasurementError instead of returning a guess.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import asdict, dataclass

from . import netns
from .errors import MeasurementError
from .plan import FabricPlan

_PING_SUMMARY = re.compile(r"(\d+) packets transmitted, (\d+) received")
_PING_RTT = re.compile(r"= ([\d.]+)/([\d.]+)/([\d.]+)/([\d.]+) ms")


@dataclass(frozen=True)
class Rtt:
    src: str
    dst: str
    dst_address: str
    sent: int
    received: int
    min_s: float
    avg_s: float
    max_s: float
    mdev_s: float

    def as_dict(self) -> dict:
        return asdict(self)


def rtt(plan: FabricPlan, src: str, dst: str, count: int = 5, interval: float = 0.2) -> Rtt:
    """Ping from node ``src`` to host ``dst``'s address."""
    address = str(plan.host_address(dst))
    timeout = count * interval + 5
    done = netns.run(plan.netns(src), ["ping", "-n", "-q", "-c", str(count), "-i", str(interval),
                                       "-W", "2", address], timeout=timeout + 5)
    summary = _PING_SUMMARY.search(done.stdout)
    times = _PING_RTT.search(done.stdout)
    if not summary or not times:
        raise MeasurementError(f"ping {src} -> {dst} ({address}) got no reply: {done.stdout.strip() or done.stderr.strip()}")
    mn, avg, mx, mdev = (float(x) / 1e3 for x in times.groups())
    return Rtt(src, dst, address, int(summary.group(1)), int(summary.group(2)), mn, avg, mx, mdev)


def _cpu_times() -> list[int]:
    with open("/proc/stat") as f:
        return [int(x) for x in f.readline().split()[1:]]


class CpuWatch:
    """Share of CPU time the hypervisor stole (``steal`` in /proc/stat) while a measurement ran.

    A stolen vCPU stalls shapers' timers and the instrument alike: the link truly delivers less
    during that time. The figure is reported next to the rate so nobody mistakes it for the
    link's fault, and so tests can tell a noisy machine from a wrong shaper.
    """

    def __init__(self) -> None:
        self.start = _cpu_times()

    def steal(self) -> float:
        end = _cpu_times()
        delta = [b - a for a, b in zip(self.start, end)]
        total = sum(delta[:8]) or 1
        return delta[7] / total if len(delta) > 7 else 0.0


@dataclass(frozen=True)
class Rate:
    src: str
    dst: str
    dst_address: str
    configured_bps: int
    wire_bps: float
    payload_bps: float
    packets: int
    cpu_steal: float  # share of CPU stolen by the hypervisor during the measurement

    @property
    def ratio(self) -> float:
        return self.wire_bps / self.configured_bps

    def as_dict(self) -> dict:
        d = asdict(self)
        d["ratio"] = self.ratio
        return d


def link_rate(plan: FabricPlan, src: str, dst: str, dst_address: str, configured_bps: int,
              seconds: float = 1.0, warmup: float = 0.3, size: int = 4000, port: int = 47001) -> Rate:
    """Blast UDP from node ``src`` to ``dst_address`` (on node ``dst``) and count what arrives."""
    py = [sys.executable, "-m", "emulator.blast"]
    watch = None
    recv = netns.popen(plan.netns(dst), py + ["recv", "--bind", dst_address, "--port", str(port),
                                              "--warmup", str(warmup), "--seconds", str(seconds)],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = recv.stdout.readline().strip()
        if line != "ready":
            raise MeasurementError(f"receiver on {dst} did not start: {line or recv.stderr.read().strip()}")
        watch = CpuWatch()
        send = netns.run(plan.netns(src), py + ["send", "--dst", dst_address, "--port", str(port),
                                                "--size", str(size), "--seconds", str(warmup + seconds + 0.5)],
                         timeout=warmup + seconds + 30)
        if send.returncode != 0:
            raise MeasurementError(f"sender on {src} failed: {send.stderr.strip()}")
        out, err = recv.communicate(timeout=30)
    finally:
        if recv.poll() is None:
            recv.kill()
            recv.wait()
    result = json.loads(out.strip().splitlines()[-1]) if out.strip() else {"error": err.strip()}
    if "error" in result:
        raise MeasurementError(f"rate {src} -> {dst}: {result['error']}")
    return Rate(src, dst, dst_address, configured_bps, result["wire_bps"], result["payload_bps"], result["packets"],
                watch.steal() if watch else 0.0)
