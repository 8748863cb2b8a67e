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

from contextlib import closing

from emulator.errors import MeasurementError
from emulator.fabric import netns, queues
from emulator.model.plan import FabricPlan, Port
from emulator.telemetry.cpu import CpuWatch

_PING_SUMMARY = re.compile(r"(\d+) packets transmitted, (\d+) received")


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


_PING_REPLY = re.compile(r"icmp_seq=(\d+) .*time=([\d.]+) ms")


def rtt(plan: FabricPlan, src: str, dst: str, count: int = 5, interval: float = 0.2) -> Rtt:
    """Ping from node ``src`` to host ``dst``'s address: ``count`` replies after one warm-up.

    The warm-up's reply is left out: its packet resolves the neighbours of every hop on the way
    (across a 15 ms fiber that alone costs a round trip), which is set-up, not the path's RTT."""
    address = str(plan.host_address(dst))
    # A reply may take the fabric's longest round trip as dilated (6 s at d = 200 across the
    # DCs): wait for three of them, and never less than ping's usual 2 s.
    longest = 2 * (plan.wan_delay_s() + plan.spec.emulated_time(plan.spec.intra_dc_one_way_s()))
    wait = max(2.0, 3 * longest)
    timeout = (count + 1) * interval + wait + 5
    done = netns.run(plan.netns(src), ["ping", "-n", "-c", str(count + 1), "-i", str(interval),
                                       "-W", f"{wait:g}", address], timeout=timeout + 5)
    summary = _PING_SUMMARY.search(done.stdout)
    times = [float(t) / 1e3 for seq, t in _PING_REPLY.findall(done.stdout) if int(seq) > 1]
    if not summary or not times:
        raise MeasurementError(f"ping {src} -> {dst} ({address}) got no reply: {done.stdout.strip() or done.stderr.strip()}")
    avg = sum(times) / len(times)
    mdev = (sum((t - avg) ** 2 for t in times) / len(times)) ** 0.5
    return Rtt(src, dst, address, int(summary.group(1)) - 1, len(times), min(times), avg, max(times), mdev)


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
    delay_line_drops: int | None = None  # packets the path's netem dropped meanwhile (None: no path)

    @property
    def ratio(self) -> float:
        return self.wire_bps / self.configured_bps

    def as_dict(self) -> dict:
        d = asdict(self)
        d["ratio"] = self.ratio
        return d


def qdisc_counters(plan: FabricPlan, port: Port) -> dict:
    """The kernel's counters of the root qdisc on ``port``'s egress."""
    with closing(netns.iproute(plan.netns(port.node))) as ipr:
        found = ipr.link_lookup(ifname=port.ifname)
        if not found:
            raise MeasurementError(f"{port.node} has no interface {port.ifname}")
        return queues.counters(ipr, found[0])


def _start_sender(plan: FabricPlan, src: str, args: list[str], recv: subprocess.Popen) -> subprocess.Popen:
    """Start the blaster's sender in ``src``; once it says it is sending, tell the receiver
    (recv --go) to start its wait for a first packet, however long the sender's Python took to
    start (seconds under software emulation)."""
    send = netns.popen(plan.netns(src), [sys.executable, "-m", "emulator.tools.blast", "send", *args],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if send.stdout.readline().strip() == "sending":
        recv.stdin.write("go\n")
        recv.stdin.flush()
    return send


def _stop(*procs: subprocess.Popen | None) -> None:
    for proc in procs:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()


def link_rate(plan: FabricPlan, src: str, dst: str, dst_address: str, configured_bps: int,
              seconds: float = 1.0, warmup: float = 0.3, size: int = 4000, port: int = 47001,
              delay_port: Port | None = None) -> Rate:
    """Blast UDP from node ``src`` to ``dst_address`` (on node ``dst``) and count what arrives.
    With ``delay_port`` (the fiber's egress on a long-haul path) also count netem's drops."""
    py = [sys.executable, "-m", "emulator.tools.blast"]
    watch = None
    before = qdisc_counters(plan, delay_port) if delay_port else None
    recv = netns.popen(plan.netns(dst), py + ["recv", "--bind", dst_address, "--port", str(port),
                                              "--warmup", str(warmup), "--seconds", str(seconds), "--go"],
                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    send = None
    try:
        line = recv.stdout.readline().strip()
        if line != "ready":
            raise MeasurementError(f"receiver on {dst} did not start: {line or recv.stderr.read().strip()}")
        watch = CpuWatch()
        send = _start_sender(plan, src, ["--dst", dst_address, "--port", str(port), "--size", str(size),
                                         "--seconds", str(warmup + seconds + 0.5)], recv)
        _, send_err = send.communicate(timeout=warmup + seconds + 30)
        if send.returncode != 0:
            raise MeasurementError(f"sender on {src} failed: {send_err.strip()}")
        out, err = recv.communicate(timeout=30)
    finally:
        _stop(send, recv)
    result = json.loads(out.strip().splitlines()[-1]) if out.strip() else {"error": err.strip()}
    if "error" in result:
        raise MeasurementError(f"rate {src} -> {dst}: {result['error']}")
    drops = qdisc_counters(plan, delay_port)["drops"] - before["drops"] if delay_port and before else None
    return Rate(src, dst, dst_address, configured_bps, result["wire_bps"], result["payload_bps"], result["packets"],
                watch.steal() if watch else 0.0, drops)


@dataclass(frozen=True)
class Loss:
    src: str
    dst: str
    dst_address: str
    configured: float  # the path's configured per-packet loss probability
    sent: int
    received: int
    delay_line_drops: int  # what the path's netem counted as dropped meanwhile

    @property
    def observed(self) -> float:
        return 1 - self.received / self.sent

    def as_dict(self) -> dict:
        d = asdict(self)
        d["observed"] = self.observed
        return d


def path_loss(plan: FabricPlan, src: str, dst: str, dst_address: str, delay_port: Port, configured: float,
              count: int = 5000, pps: float = 1000.0, size: int = 1000, port: int = 47002) -> Loss:
    """Send exactly ``count`` packets over one long-haul path, paced well below its rate, and count
    what arrives: the path's loss as a receiver sees it, next to netem's own drop counter."""
    py = [sys.executable, "-m", "emulator.tools.blast"]
    before = qdisc_counters(plan, delay_port)
    recv = netns.popen(plan.netns(dst), py + ["recv", "--bind", dst_address, "--port", str(port),
                                              "--count", str(count), "--idle", "2", "--idle-after-eof", "--go"],
                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    send = None
    try:
        line = recv.stdout.readline().strip()
        if line != "ready":
            raise MeasurementError(f"receiver on {dst} did not start: {line or recv.stderr.read().strip()}")
        send = _start_sender(plan, src, ["--dst", dst_address, "--port", str(port), "--size", str(size),
                                         "--count", str(count), "--pps", str(pps)], recv)
        send_out, send_err = send.communicate(timeout=count / pps * 3 + 60)
        if send.returncode != 0:
            raise MeasurementError(f"sender on {src} failed: {send_err.strip()}")
        sent = json.loads(send_out.strip().splitlines()[-1])["sent_packets"]
        # Closing its stdin tells the receiver the sender is done: only now may a quiet spell end
        # the count (a stalled machine must not cut the measurement short).
        out, err = recv.communicate(timeout=60)
    finally:
        _stop(send, recv)
    result = json.loads(out.strip().splitlines()[-1]) if out.strip() else {"error": err.strip()}
    if "error" in result:
        raise MeasurementError(f"loss {src} -> {dst}: {result['error']}")
    drops = qdisc_counters(plan, delay_port)["drops"] - before["drops"]
    if result.get("socket_drops"):
        raise MeasurementError(f"loss {src} -> {dst}: the receiver's own socket dropped {result['socket_drops']} "
                               "packets (the machine held it up past its buffer): the path's loss cannot be read "
                               "from this run")
    return Loss(src, dst, dst_address, configured, sent, result["packets"], drops)
