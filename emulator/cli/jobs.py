"""``backplane measure`` and ``backplane run``: jobs on a running fabric."""
from __future__ import annotations

import json
import math
import os
import signal
import time
from dataclasses import dataclass

import click

from emulator import errors
from emulator.cli.app import core, main, name_option, need_root
from emulator.cli.text import format_collective, format_recording, format_training, format_transfer
from emulator.control import client, state
from emulator.model import plan as plan_mod, spec, units
from emulator.telemetry import report, timeline
from emulator.telemetry.cpu import STEAL_LIMIT
# Only the workloads' option bounds and profiles here: the modules that run them (numpy,
# netlink) are imported by the commands that use them, as in emulator/cli/commands.py.
from emulator.workload import limits, profiles

# Telemetry every this much wall time unless asked otherwise: the sampler's own cost bounds it.
DEFAULT_SAMPLE_WALL_S = 0.010


@main.group()
def measure() -> None:
    """Measure a running fabric."""


@measure.command(name="link")
@name_option
@click.argument("src")
@click.argument("dst")
@click.option("--path", "path_index", type=int, default=None, help="Long-haul path between two borders.")
@click.option("--seconds", type=float, default=1.0, show_default=True)
@click.option("--json", "as_json", is_flag=True)
@core
def measure_link(name: str, src: str, dst: str, path_index: int | None, seconds: float, as_json: bool) -> None:
    """Blast UDP from SRC to its neighbour DST and report the rate that arrives vs the configured one."""
    need_root("measure link")
    from emulator.telemetry import measure as measure_mod

    fabric = client.running(name)
    fabric_plan = fabric.plan
    port, peer, fiber = fabric_plan.link_between(src, dst, path_index)
    result = measure_mod.link_rate(fabric_plan, src, dst, str(peer.address.ip), port.egress.rate_bps, seconds=seconds,
                                   delay_port=fiber if fiber is not None and fabric.wan_delay else None)
    if as_json:
        click.echo(json.dumps(result.as_dict(), indent=2))
        return
    click.echo(f"{src} -> {dst} ({peer.address.ip}): {units.format_rate(result.wire_bps)} on the wire of "
               f"{units.format_rate(result.configured_bps)} configured ({result.ratio:.3f}), "
               f"{result.packets} packets in {seconds:g} s")
    if result.delay_line_drops is not None:
        click.echo(f"the path's delay line (netem on {fiber.node}) dropped {result.delay_line_drops} packets")
    if result.cpu_steal > STEAL_LIMIT:
        click.echo(f"WARNING: the hypervisor stole {result.cpu_steal:.0%} of this machine's CPU during the "
                   "measurement; shapers stall with it, so this figure understates the link")


@measure.command(name="loss")
@name_option
@click.argument("src")
@click.argument("dst")
@click.option("--path", "path_index", type=int, required=True, help="Long-haul path between the two borders.")
@click.option("--count", type=int, default=5000, show_default=True, help="Packets to send.")
@click.option("--pps", type=float, default=1000.0, show_default=True, help="Packets per second.")
@click.option("--json", "as_json", is_flag=True)
@core
def measure_loss(name: str, src: str, dst: str, path_index: int, count: int, pps: float, as_json: bool) -> None:
    """Send COUNT packets from border SRC to border DST over one long-haul path; report the loss."""
    need_root("measure loss")
    from emulator.telemetry import measure as measure_mod

    fabric = client.running(name)
    fabric_plan = fabric.plan
    port, peer, fiber = fabric_plan.link_between(src, dst, path_index)
    if fiber is None:
        raise errors.BackplaneError(f"{src} and {dst} are not joined by long-haul path {path_index}")
    if not fabric.wan_delay:
        raise errors.CapabilityError(f"fabric {name!r} runs without its delay lines (--no-wan-delay), so its "
                                     "long-haul paths have no netem and no configured loss",
                                     "bring it up with the delay, on a kernel with sch_netem (backplane vm run)")
    result = measure_mod.path_loss(fabric_plan, src, dst, str(peer.address.ip), fiber, fiber.egress.loss,
                                   count=count, pps=pps)
    if as_json:
        click.echo(json.dumps(result.as_dict(), indent=2))
        return
    click.echo(f"{src} -> {dst} over path {path_index}: {result.received} of {result.sent} packets arrived, "
               f"loss {result.observed:.4f} observed vs {result.configured:.4f} configured; "
               f"the path's netem dropped {result.delay_line_drops}")


@main.group(name="run")
def run_group() -> None:
    """Run a job on a running fabric."""


@run_group.command(name="transfer")
@name_option
@click.argument("src")
@click.argument("dst")
@click.option("--size", default="64MB", show_default=True, help="Bytes to move from each sender, e.g. 256MB.")
@click.option("--qps", type=click.IntRange(1, 1024), default=None, help="Queue pairs per sender [default: the topology's nic.qps_per_pair].")
@click.option("--transport", type=click.Choice(spec.TRANSPORTS), default=None,
              help="Loss recovery [default: the topology's nic.transport].")
@click.option("--dcqcn", type=click.Choice(list(spec.DCQCN_PROFILES)), default=None,
              help="DCQCN profile the NICs run [default: the topology's nic.dcqcn, with its overrides]. "
                   "The switches keep the ECN thresholds the fabric was started with.")
@click.option("--sample", default=None,
              help="Telemetry period in the real fabric's time: QP rates, alpha and CNPs, and switch queues "
                   "and marks (0: none) [default: 10 ms of wall time, whatever the dilation].")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None,
              help="Write a PNG of rate and queue depth over time here.")
@click.option("--timeout", type=click.FloatRange(0, min_open=True), default=600.0, show_default=True,
              help="Give up after this many seconds.")
@click.option("--json", "as_json", is_flag=True)
@core
def run_transfer(name: str, src: str, dst: str, size: str, qps: int | None, transport: str | None, dcqcn: str | None,
                 sample: str | None, plot_path: str | None, timeout: float, as_json: bool) -> None:
    """RDMA WRITE SIZE bytes from host SRC to host DST through the soft-NICs; report goodput,
    completion time, retransmissions, timeouts and DCQCN's work, per QP, and check the data
    arrived intact. SRC may name several hosts, comma-separated: they send at once (an incast),
    and the report adds their fairness and the switch queues they built. Figures are the real
    fabric's (times / dilation, rates / scale, bytes / scale*dilation); --json keeps the
    emulated ones with the time model that converts them."""
    need_root("run transfer")
    from emulator.fabric import capabilities
    from emulator.workload import transfer

    try:
        nbytes = units.parse_size(size)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--size")
    if plot_path:
        check_plot_path(plot_path)
    fabric_plan = client.running(name).plan
    fspec = fabric_plan.spec
    try:
        if sample is None:
            period = DEFAULT_SAMPLE_WALL_S
        else:
            period = 0.0 if sample.strip() in ("0", "0s") else fspec.time.time(units.parse_duration(sample))
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--sample")
    qps = qps or fspec.nic.qps_per_pair
    transport = transport or fspec.nic.transport
    srcs = [h for h in src.split(",") if h]
    transfer.check_request(fabric_plan, srcs, dst, nbytes, qps, transport, timeout, capabilities.mem_available())
    sampler = (lambda: client.request(name, {"op": "sample"})) if fspec.ecmp.datapath == "ebpf" else None
    marks: list[int] = []  # the fabric's guard watches the run from when the data starts

    def started() -> None:
        marks.append(client.request(name, {"op": "fidelity"})["mark"])

    try:
        r = transfer.run(fabric_plan, srcs, dst, nbytes, qps, transport, timeout=timeout,
                         cc=transfer.choose_profile(fspec, dcqcn), sample_s=period, sampler=sampler,
                         on_start=started)
    except transfer.WorkerFailed as e:
        gone = fabric_gone(name)
        if gone:
            raise errors.MeasurementError(f"fabric {name!r} went away during the transfer ({gone}); {e}") from None
        raise
    body = r.as_dict()
    machine, lost = None, None
    try:
        machine = client.request(name, {"op": "fidelity", "since": marks[0]})["fidelity"]
    except errors.BackplaneError as e:
        lost = f"the fabric's controller did not answer after the transfer: {e}"
    body["figures"] = {"ports": report.ports(body),
                       "fairness": report.fairness(body, max(period, 10 * r.rtt_s)) if period else {},
                       "reaction": report.reaction(body)}
    if fspec.pfc.enabled and sampler is not None and not lost:
        agent = client.request(name, {"op": "pfc"})["pfc"]
        body["pfc"] = {"storms": agent["storms"], "injected": agent["injected"]}
    body["fidelity"] = report.fidelity(body, machine)
    if lost:
        body["fidelity"]["machine_limits"].append(lost)
    if plot_path:
        report.plot(body, plot_path)
    if as_json:
        click.echo(json.dumps(body, indent=2))
    else:
        for line in format_transfer(body):
            click.echo(line)
        if plot_path:
            click.echo(f"  plot: {plot_path}")
    cut = body["telemetry"].get("ports_error")
    if cut or lost:
        raise errors.MeasurementError(f"the transfer ran ({'intact' if r.intact and r.complete else 'NOT intact'}), "
                                      "but its switch figures are incomplete: "
                                      f"{cut or lost}")
    if not (r.intact and r.complete):
        raise errors.MeasurementError("the transfer did not complete intact")


admission_option = click.option(
    "--admission", type=click.IntRange(0, limits.MAX_ADMISSION), default=None,
    help="Receiver-driven admission: receivers clear this many messages per link and channel ahead and "
         "senders write only what is cleared (Meta's clear-to-send); 0: none [default: the profile's, else 0].")


@dataclass
class _Settings:
    """A collective's transport as the options and the job profile set it, and what that
    profile asks of the fabric that it cannot give (``notes``)."""

    profile: profiles.JobProfile | None
    qps: int
    transport: str
    dcqcn: str | None
    admission: int
    notes: list[str]
    ebpf: bool  # the fabric's switches run the eBPF datapath, whose hash can be set

    def apply(self, name: str) -> None:
        """Set the switches' hash as the profile has it (the one thing it changes on the fabric)."""
        if self.profile is not None and self.ebpf:
            client.request(name, {"op": "set_hash", "hash": self.profile.hash})
            self.notes.insert(0, f"profile {self.profile.name}: the switches now hash {self.profile.hash}")


def _settings(fspec, profile: str | None, qps: int | None, transport: str | None, dcqcn: str | None,
              admission: int | None) -> _Settings:
    prof = profiles.PROFILES[profile] if profile else None
    return _Settings(prof, qps or (prof.qps if prof else fspec.nic.qps_per_pair),
                     transport or (prof.transport if prof else fspec.nic.transport),
                     dcqcn or (prof.dcqcn if prof else None),
                     admission if admission is not None else (prof.admission if prof else 0),
                     profiles.differences(prof, fspec.pfc.enabled, fspec.ecmp.datapath) if prof else [],
                     fspec.ecmp.datapath == "ebpf")


@run_group.command(name="collective")
@name_option
@click.argument("op", type=click.Choice([o.replace("_", "-") for o in limits.OPS]))
@click.option("--hosts", required=True, help="The ranks, comma-separated, in ring order (hosts of one DC together).")
@click.option("--size", default="4MB", show_default=True,
              help="nccl-tests' size as the NICs move it (emulated bytes; the report gives the real ones).")
@click.option("--channels", type=click.IntRange(1, limits.MAX_CHANNELS), default=1, show_default=True,
              help="Rings run side by side, each over its own QPs.")
@click.option("--qps", type=click.IntRange(1, limits.MAX_QPS), default=None,
              help="QPs per link, a message split over them [default: the topology's nic.qps_per_pair].")
@click.option("--chunk", default=units.format_size(limits.CHUNK_BYTES), show_default=True,
              help="A message is cut into chunks of this size (emulated bytes) dealt round its QPs; each chunk "
                   "goes on to the next step as soon as it has come, while the others are on the wire.")
@click.option("--transport", type=click.Choice(spec.TRANSPORTS), default=None,
              help="Loss recovery [default: the topology's nic.transport].")
@click.option("--dcqcn", type=click.Choice(list(spec.DCQCN_PROFILES)), default=None,
              help="DCQCN profile the NICs run [default: the topology's nic.dcqcn].")
@click.option("--profile", type=click.Choice(sorted(profiles.PROFILES)), default=None,
              help="Set the switches' hash, QPs, transport, DCQCN and admission as a deployment ran them (the "
                   "other options override it); what the fabric cannot give it is said.")
@admission_option
@click.option("--iters", type=click.IntRange(1, 1000), default=1, show_default=True)
@click.option("--timeout", type=click.FloatRange(0, min_open=True), default=600.0, show_default=True,
              help="Give up on a run after this many seconds.")
@click.option("--out", "out_dir", default=None, type=click.Path(file_okay=False),
              help="Record the runs into this run directory (the run store: the switches' ports sampled through "
                   "them, the result in the manifest; `backplane report` reads it).")
@click.option("--json", "as_json", is_flag=True)
@core
def run_collective(name: str, op: str, hosts: str, size: str, channels: int, qps: int | None, chunk: str,
                   transport: str | None, dcqcn: str | None, profile: str | None, admission: int | None, iters: int,
                   timeout: float, out_dir: str | None, as_json: bool) -> None:
    """Run collective OP (all-reduce, all-gather, reduce-scatter, all-to-all) across HOSTS'
    soft-NICs ITERS times, check every rank's result, and report size, time, algbw and busbw as
    nccl-tests does, in the real fabric's units and the emulated ones, beside the alpha-beta model."""
    need_root("run collective")
    from emulator.control import scenario_runner

    try:
        nbytes = units.parse_size(size)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--size")
    try:
        chunk_bytes = units.parse_size(chunk)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--chunk")
    body = collective_job(name, op.replace("-", "_"), [h for h in hosts.split(",") if h], nbytes, channels, qps,
                          transport, dcqcn, profile, admission, iters, timeout, record=out_dir is not None,
                          chunk=chunk_bytes)
    if out_dir is not None:
        body["recorded"] = scenario_runner.record_collective(name, body, out_dir)
    body.pop("telemetry", None)
    if as_json:
        click.echo(json.dumps(body, indent=2))
    else:
        for line in format_collective(body):
            click.echo(line)
    if not (body["intact"] and body["complete"]):
        raise errors.MeasurementError("the collective did not complete with every rank's result right")


def collective_job(name: str, op: str, ranks: list[str], nbytes: int, channels: int = 1, qps: int | None = None,
                   transport: str | None = None, dcqcn: str | None = None, profile: str | None = None,
                   admission: int | None = None, iters: int = 1, timeout: float = 600.0, record: bool = False,
                   chunk: int = limits.CHUNK_BYTES, rtts: dict | None = None) -> dict:
    """``run collective`` without the printing: OP on fabric ``name``'s hosts ``ranks`` as the
    options and ``profile`` set it; the report's record (bench/distance.py runs many in one process).
    ``record``: the switches' ports are sampled through the runs, into the record's telemetry.
    ``rtts``: host pairs' RTTs measured on this fabric before (collective.run), kept up to date."""
    from emulator.control import scenario_runner
    from emulator.fabric import capabilities
    from emulator.workload import collective, transfer

    fabric = client.running(name)
    fabric_plan = fabric.plan
    fspec = fabric_plan.spec
    st = _settings(fspec, profile, qps, transport, dcqcn, admission)
    collective.check_request(fabric_plan, op, ranks, nbytes, channels, st.qps, st.transport, iters, timeout,
                             capabilities.mem_available(), st.admission, chunk)
    st.apply(name)
    try:
        r = collective.run(fabric_plan, op, ranks, nbytes, channels, st.qps, st.transport, iters, timeout,
                           cc=transfer.choose_profile(fspec, st.dcqcn), admission=st.admission,
                           sampler=(lambda: client.request(name, {"op": "sample", "paths": True})) if record else None,
                           sample_s=scenario_runner.SAMPLE_WALL_S if record else 0.0, chunk=chunk, rtts=rtts)
    except transfer.WorkerFailed as e:
        gone = fabric_gone(name)
        if gone:
            raise errors.MeasurementError(f"fabric {name!r} went away during the collective ({gone}); {e}") from None
        raise
    return {**r.as_dict(), "profile": profile, "notes": st.notes, "wan_delay": fabric.wan_delay}


@run_group.command(name="training")
@name_option
@click.option("--params", required=True, help="The model's parameters, e.g. 7B: its gradients are all-reduced.")
@click.option("--bytes-per-param", type=click.IntRange(1, 8), default=2, show_default=True,
              help="Bytes of one gradient (2: bf16).")
@click.option("--gpus", "hosts", required=True, help="The ranks' hosts, comma-separated, in ring order.")
@click.option("--compute", required=True, help="The step's compute, real time, e.g. 300ms.")
@click.option("--overlap", type=click.FloatRange(0, 1), default=0.0, show_default=True,
              help="Share of the all-reduce that runs under the compute (bucketed gradients).")
@click.option("--channels", type=click.IntRange(1, limits.MAX_CHANNELS), default=1, show_default=True)
@click.option("--qps", type=click.IntRange(1, limits.MAX_QPS), default=None,
              help="QPs per link [default: the topology's nic.qps_per_pair].")
@click.option("--transport", type=click.Choice(spec.TRANSPORTS), default=None)
@click.option("--dcqcn", type=click.Choice(list(spec.DCQCN_PROFILES)), default=None)
@click.option("--profile", type=click.Choice(sorted(profiles.PROFILES)), default=None,
              help="The all-reduce's job profile, as for run collective.")
@admission_option
@click.option("--iters", type=click.IntRange(1, 1000), default=1, show_default=True)
@click.option("--timeout", type=click.FloatRange(0, min_open=True), default=600.0, show_default=True)
@click.option("--json", "as_json", is_flag=True)
@core
def run_training(name: str, params: str, bytes_per_param: int, hosts: str, compute: str, overlap: float,
                 channels: int, qps: int | None, transport: str | None, dcqcn: str | None, profile: str | None,
                 admission: int | None, iters: int, timeout: float, as_json: bool) -> None:
    """A training step: COMPUTE, then (or, OVERLAP of it, during) the all-reduce of PARAMS'
    gradients across GPUS, measured on the fabric; gives the step time and the share of it spent
    waiting on the network, in the real fabric's time."""
    need_root("run training")
    from emulator.fabric import capabilities
    from emulator.workload import collective, collectives, transfer

    try:
        grads = units.parse_count(params) * bytes_per_param
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--params")
    try:
        compute_s = units.parse_duration(compute)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--compute")
    fabric = client.running(name)
    fabric_plan = fabric.plan
    fspec = fabric_plan.spec
    tm = fspec.time
    ranks = [h for h in hosts.split(",") if h]
    st = _settings(fspec, profile, qps, transport, dcqcn, admission)
    size = tm.size(grads)  # the gradients are the real fabric's bytes: x s*d on the NICs
    collective.check_request(fabric_plan, "all_reduce", ranks, size, channels, st.qps, st.transport, iters, timeout,
                             capabilities.mem_available(), st.admission, chunk)
    st.apply(name)
    r = collective.run(fabric_plan, "all_reduce", ranks, size, channels, st.qps, st.transport, iters, timeout,
                       cc=transfer.choose_profile(fspec, st.dcqcn), admission=st.admission)
    if not (r.intact and r.complete):
        raise errors.MeasurementError("the gradients' all-reduce did not complete with every rank's result right")
    st = collectives.step(compute_s, tm.real_time(r.time_s), overlap)
    body = {"params": units.parse_count(params), "bytes_per_param": bytes_per_param, "gradient_bytes": grads,
            "compute_s": compute_s, "overlap": overlap, "comm_s": st.comm_s, "exposed_s": st.exposed_s,
            "step_s": st.step_s, "waiting_share": st.waiting_share,
            "collective": {**r.as_dict(), "profile": profile, "notes": st.notes, "wan_delay": fabric.wan_delay}}
    if as_json:
        click.echo(json.dumps(body, indent=2))
        return
    for line in format_collective(body["collective"]):
        click.echo(line)
    click.echo(format_training(body))


@main.command()
@name_option
@click.option("--for", "duration", default=None, help="How long, in the real fabric's time (e.g. 1.5ms): "
              "the fabric's dilation stretches it [default: until Ctrl-C or SIGTERM].")
@click.option("--every", "period", default=None, help="Sample period, real time [default: 10 ms of wall time].")
@click.option("--port", "ports", multiple=True, help="NODE:IFNAME to plot (repeat) [default: the ports that "
              "paused longest, then moved most].")
@click.option("--title", default=None, help="The plot's title.")
@click.option("--plot", "plot_path", default=None, help="Write a PNG timeline here.")
@click.option("--json", "as_json", is_flag=True, help="The samples and the PFC agent's storms, as JSON.")
@core
def record(name: str, duration: str | None, period: str | None, ports: tuple[str, ...], title: str | None,
           plot_path: str | None, as_json: bool) -> None:
    """Record the switches' ports of a running fabric for a while: what each moved, its queue,
    when PFC held it paused, and the watchdog's storms, on one clock."""
    need_root("record")
    if plot_path:
        check_plot_path(plot_path)
    fspec = client.running(name).plan.spec
    if fspec.ecmp.datapath != "ebpf":
        raise errors.UsageError(f"fabric {name!r} runs the kernel datapath: its ports have no queue figures to record")
    try:
        wall_s = math.inf if duration is None else fspec.time.time(units.parse_duration(duration))
        every = DEFAULT_SAMPLE_WALL_S if period is None else fspec.time.time(units.parse_duration(period))
    except ValueError as e:
        raise click.BadParameter(str(e)) from None
    if every <= 0 or wall_s < 2 * every:
        raise click.BadParameter(f"--for {duration} is {wall_s:g} s of wall time: record at least two samples "
                                 f"({every:g} s apart)")
    readings = [client.request(name, {"op": "sample"})]
    known = {p["port"] for p in readings[0]["ports"]}
    unknown = [p for p in ports if p not in known]
    if unknown:
        raise click.BadParameter(f"no switch port {', '.join(unknown)}; the fabric's are {', '.join(sorted(known))}",
                                 param_hint="--port")
    end = readings[0]["t"] + wall_s
    stop = []  # Ctrl-C or SIGTERM ends the recording, which is then reported as usual
    before = {sig: signal.signal(sig, lambda *_: stop.append(True)) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        if duration is None:
            click.echo(f"recording fabric {name!r} every {every:g} s of wall time; Ctrl-C ends it", err=True)
        while readings[-1]["t"] < end and not stop:
            time.sleep(min(every, max(0.0, end - time.monotonic())))  # the sample period, not a wait for state
            readings.append(client.request(name, {"op": "sample"}))
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
    if len(readings) < 2:
        readings.append(client.request(name, {"op": "sample"}))
    body = {"fabric": name, "title": title or f"fabric {name}", "time_model": fspec.time.as_dict(),
            "readings": [{"t": r["t"], "ports": r["ports"]} for r in readings], "storms": [], "injected": []}
    if fspec.pfc.enabled:
        agent = client.request(name, {"op": "pfc"})["pfc"]
        body["storms"], body["injected"] = agent["storms"], agent["injected"]
    body["summary"] = timeline.summary(body)
    if plot_path:
        timeline.plot(body, plot_path, list(ports) or None)
    if as_json:
        click.echo(json.dumps(body, indent=2))
        return
    for line in format_recording(body):
        click.echo(line)
    if plot_path:
        click.echo(f"  plot: {plot_path}")


def check_plot_path(path: str) -> None:
    """Refuse a plot that could not be written, before the transfer runs."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise click.BadParameter(f"no folder {folder} to write {os.path.basename(path)} in", param_hint="--plot")
    if not os.access(folder, os.W_OK):
        raise click.BadParameter(f"folder {folder} is not writable", param_hint="--plot")


def fabric_gone(name: str, settle_s: float = 10.0) -> str | None:
    """Why fabric ``name`` no longer answers (taken down, or its controller died), or None if
    it does. A fabric being taken down stops answering before its namespaces are gone: give
    it ``settle_s`` to say which."""
    from emulator.fabric import netns

    try:
        client.request(name, {"op": "ping"}, timeout=settle_s)
        return None
    except errors.BackplaneError as e:
        reason = str(e)
    deadline = time.monotonic() + settle_s
    while time.monotonic() < deadline:
        if not netns.names(plan_mod.prefix_of(name)):
            return "taken down"
        rec = state.read_record(name)
        if rec is not None and not rec.alive():
            return f"its controller (pid {rec.pid}) died"
        time.sleep(0.1)
    return reason
