"""The backplane command line: a thin click shell over the core.

The core never prints and raises typed errors; this module turns results into text or JSON and
errors into a message on stderr and the error's exit code.
"""
from __future__ import annotations

import functools
import json
import os
import sys
import time
from pathlib import Path

import click

from . import capabilities, client, errors, spec, state, units
from . import clean as clean_mod
from . import netns
from . import vm as vm_mod
from . import plan as plan_mod
from .describe import NO_DELAY_WARNING
from .timemodel import TimeModel

REPO = Path(__file__).resolve().parent.parent
DEFAULT_TOPOLOGY = REPO / "topologies" / "cross-dc.yaml"
# Telemetry every this much wall time unless asked otherwise: the sampler's own cost bounds it.
DEFAULT_SAMPLE_WALL_S = 0.010


def _fail(e: errors.BackplaneError) -> None:
    click.echo(f"backplane: error: {e}", err=True)
    sys.exit(e.exit_code)


def core(fn):
    """Map the core's typed errors to messages and exit codes."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except errors.BackplaneError as e:
            _fail(e)

    return wrapper


def need_root(command: str) -> None:
    if os.geteuid() != 0:
        raise errors.CapabilityError(f"`backplane {command}` builds network namespaces and needs root",
                                     f"sudo {sys.argv[0]} {command} ...")


name_option = click.option("--name", "-n", default=plan_mod.DEFAULT_NAME, show_default=True,
                           help="Fabric name: its namespaces are bp-<name>-<node>.")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """backplane: a cross-datacenter RoCEv2 fabric on real Linux networking."""


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@core
def doctor(as_json: bool) -> None:
    """Check what this machine can do, each item with the command that fixes it."""
    checks = capabilities.doctor()
    if as_json:
        click.echo(json.dumps([c.as_dict() for c in checks], indent=2))
    else:
        for c in checks:
            mark = "ok  " if c.ok else "FAIL"
            click.echo(f"{mark} {c.name:<12} {c.detail}")
            if not c.ok and c.fix:
                click.echo(f"     {'':<12} fix: {c.fix}")
    required = {"root", "mnexec", "iproute2", "tc", "ping", "qdisc htb", "qdisc tbf", "bcc"}
    if any(not c.ok and c.name in required for c in checks):
        sys.exit(errors.CapabilityError.exit_code)


@main.command()
@click.argument("topology", required=False, type=click.Path(dir_okay=False))
@name_option
@click.option("--no-wan-delay", is_flag=True,
              help="Run without the long-haul delay (kernels without sch_netem); said on every report.")
@click.option("--dilation", default=None, metavar="D|realtime|faithful",
              help="Run every time x D and every byte x scale*D, replacing the topology's dilation "
                   "(realtime: D = 1; faithful: D = 1/scale, real bytes and true per-packet granularity).")
@click.option("--json", "as_json", is_flag=True)
@core
def up(topology: str | None, name: str, no_wan_delay: bool, dilation: str | None, as_json: bool) -> None:
    """Build a fabric from TOPOLOGY (default: topologies/cross-dc.yaml) and keep it up."""
    need_root("up")
    path = os.path.abspath(topology) if topology else str(DEFAULT_TOPOLOGY)
    # Bad input fails here, before any effect.
    fabric_plan = plan_mod.build(spec.load(path, spec.parse_dilation(dilation)), name)
    if fabric_plan.spec.wan_paths and not no_wan_delay and not capabilities.has_netem():
        raise errors.CapabilityError(
            "this kernel has no sch_netem, so the 3,000 km long-haul delay cannot be emulated here; "
            "backplane refuses to build a fabric whose WAN would silently be 0 ms long",
            "run it in the delay tier's VM, whose stock kernel has netem (backplane vm run -- CMD, "
            "or sudo make demo), or bring it up without the delay (reported on every "
            f"line that shows a long-haul path): backplane up {topology or ''} --no-wan-delay".replace("  ", " "),
        )
    reply = client.spawn(name, path, wan_delay=not no_wan_delay, dilation=dilation)
    if as_json:
        click.echo(json.dumps(reply, indent=2))
        return
    click.echo(f"fabric {name!r} up in {reply['up_seconds']:.2f} s: {reply['nodes']} nodes, {reply['links']} links "
               f"(controller pid {reply['pid']}, namespaces {plan_mod.prefix_of(name)}*)")
    click.echo(fabric_plan.spec.time.line())
    if fabric_plan.spec.wan_paths and not reply["wan_delay"]:
        click.echo(f"WARNING: {NO_DELAY_WARNING}")
    click.echo(f"next: backplane status --name {name}; backplane exec --name {name} NODE -- CMD; "
               f"backplane down --name {name}")


@main.command()
@name_option
@click.option("--json", "as_json", is_flag=True)
@click.option("--no-rtt", is_flag=True, help="Skip the RTT measurement.")
@core
def status(name: str, as_json: bool, no_rtt: bool) -> None:
    """Nodes, links, rates (read back from the kernel) and RTTs measured now."""
    need_root("status")
    body = client.request(name, {"op": "status", "rtt": not no_rtt})["status"]
    if as_json:
        click.echo(json.dumps(body, indent=2))
        return
    for line in format_status(body):
        click.echo(line)
    if body.get("ports"):
        click.echo(f"switch ports (eBPF datapath; live: backplane stats --name {name} --watch 1), real units:")
        for line in format_port_table(body["ports"], _tm(body)):
            click.echo(line)


def _egress_text(e: dict) -> str:
    k = e.get("kernel", {})
    if (e.get("configured") or {}).get("kind") == "none":
        return f"NO DELAY LINE ({k.get('kind')}; --no-wan-delay)"
    if k.get("kind") in ("htb", "tbf"):
        conf = e.get("configured", {})
        limit = k.get("limit_bytes", 0)
        buffer = (f"buffer {units.format_size(conf['buffer_bytes'])} (eBPF tail drop; qdisc limit "
                  f"{units.format_size(limit)})" if conf.get("buffer_bytes") not in (None, limit)
                  else f"buffer {units.format_size(limit)}")
        return (f"{k['kind']} {units.format_rate(k['rate_bps'])} (real {units.format_rate(conf.get('real_rate_bps'))}), "
                f"{buffer}")
    if k.get("kind") == "netem":
        return (f"netem {units.format_duration(k['delay_s'])} loss {k['loss']:.3g} "
                f"corrupt {k['corruption']:.3g} limit {k['limit_packets']}p")
    return k.get("kind", "?")


def format_status(body: dict) -> list[str]:
    tm = _tm(body)
    lines = [f"fabric {body['name']!r} from {body['topology']}  MTU {body['mtu']}  controller pid {body['controller_pid']}",
             tm.line()]
    for w in body["warnings"]:
        lines.append(f"WARNING: {w}")
    roles: dict[str, list[str]] = {}
    for n in body["nodes"]:
        roles.setdefault(n["role"], []).append(n["name"])
    lines.append("nodes:")
    for role, names in roles.items():
        plural = {"leaf": "leaves"}.get(role, role + "s")
        lines.append(f"  {plural:<8} {' '.join(names)}")
    lines.append("links (egress as installed in the kernel):")
    for link in body["links"]:
        a, b = link["a"], link["b"]
        head = f"  {link['kind']:<6} {a['node']}:{a['ifname']} <-> {b['node']}:{b['ifname']}"
        lines.append(f"{head:<48} -> {_egress_text(a)} | <- {_egress_text(b)}")
    if body["wan_paths"]:
        lines.append("long-haul paths:")
    for p in body["wan_paths"]:
        delay = (f"{units.format_duration(p['one_way_delay_s'])} one way" if p["delay_emulated"]
                 else f"NO DELAY (configured {units.format_duration(p['configured_one_way_delay_s'])}; --no-wan-delay)")
        if p["delay_emulated"] and tm.dilation != 1:
            delay += f" ({units.format_duration(p['wall_one_way_delay_s'])} of wall time)"
        lines.append(f"  {p['fiber']:<5} {p['distance_m'] / 1e3:g} km  {units.format_rate(p['real_rate_bps'])} "
                     f"(emulated {units.format_rate(p['rate_bps'])})  loss {p['loss']:.3g}"
                     f"{' (eBPF)' if p.get('loss_by') == 'ebpf' else ''}  "
                     f"corruption {p['corruption']:.3g}  {delay}")
    cc = body.get("congestion")
    if cc:
        e = cc["ecn"]
        over = ", ".join(f"{k}={v:g}" for k, v in cc["dcqcn_overrides"].items())
        src = e["source"]
        origin = src["kmin"] if len(set(src.values())) == 1 else ", ".join(f"{k} {v}" for k, v in src.items())
        lines.append(f"congestion control: DCQCN {cc['dcqcn']}{f' ({over})' if over else ''}; switch ECN "
                     f"Kmin {units.format_size(e['kmin'])} Kmax {units.format_size(e['kmax'])} Pmax {e['pmax']:.3g} "
                     f"(emulated {units.format_size(e['emulated_kmin'])}/{units.format_size(e['emulated_kmax'])}; "
                     f"from {origin})")
    intra = body.get("intra_dc")
    if intra:
        applied = (f"held by netem on each host's egress ({units.format_duration(intra['wall_one_way_s'])} of wall "
                   "time each way)" if intra["applied"] else
                   f"NOT APPLIED ({intra['not_applied_because']}): the RTTs below are what the emulator itself gives")
        lines.append(f"in-DC latency: {units.format_duration(intra['rtt_s'])} RTT real ({intra['cable_m']:g} m cables, "
                     f"{units.format_duration(intra['switch_s'])} per switch); {applied}")
    if body["rtt"]:
        lines.append("RTT measured now:")
    for r in body["rtt"]:
        if "error" in r:
            lines.append(f"  {r['scope']:<10} {r['src']} -> {r['dst']}: FAILED: {r['error']}")
            continue
        note = "" if body["wan_delay"] or r["scope"] != "cross-dc" else "  (NO WAN DELAY: not the real distance)"
        real = lambda wall_s: units.format_duration(tm.real_time(wall_s))  # noqa: E731
        wall = (f" [wall: avg {units.format_duration(r['avg_s'])} min {units.format_duration(r['min_s'])}]"
                if tm.dilation != 1 else "")
        lines.append(f"  {r['scope']:<10} {r['src']} -> {r['dst']} ({r['dst_address']}): "
                     f"avg {real(r['avg_s'])} min {real(r['min_s'])} max {real(r['max_s'])} "
                     f"({r['received']}/{r['sent']} replies); expected "
                     f"{real(r['expected_s']) if r['expected_s'] else '~0'} propagation{note}{wall}")
    return lines


@main.command(name="exec", context_settings={"ignore_unknown_options": True})
@name_option
@click.argument("node")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@core
def exec_(name: str, node: str, command: tuple[str, ...]) -> None:
    """Run COMMAND inside NODE's namespace: backplane exec east-host0 -- ping 198.18.2.2"""
    need_root("exec")
    prefix = plan_mod.prefix_of(name)
    ns = node if node.startswith(prefix) else prefix + node
    if not netns.exists(ns):
        have = [n[len(prefix):] for n in netns.names(prefix)]
        if not have:
            raise errors.NotRunning(f"no fabric named {name!r} is up")
        raise errors.BackplaneError(f"fabric {name!r} has no node {node!r}; nodes: {' '.join(have)}")
    argv = netns.command(ns, list(command))
    os.execvp(argv[0], argv)


@main.command()
@name_option
@core
def down(name: str) -> None:
    """Tear a fabric down: every namespace, link, qdisc and process it made."""
    need_root("down")
    started = time.monotonic()
    rec = state.read_record(name)
    reply = client.request(name, {"op": "down"})
    if rec is not None:
        client.wait_controller_exit(name, rec)
    left = clean_mod.leftovers(name)
    if left["namespaces"] or left["processes"] or left["root_links"]:
        raise errors.FabricError(f"fabric {name!r} left {left} after down; backplane clean --name {name}")
    click.echo(f"fabric {name!r} down in {time.monotonic() - started:.2f} s "
               f"(teardown in the controller {reply['down_seconds']:.2f} s)")


@main.command()
@click.option("--name", "-n", default=None, help="Only this fabric (default: every fabric of the project).")
@click.option("--json", "as_json", is_flag=True)
@core
def clean(name: str | None, as_json: bool) -> None:
    """Remove everything the project made (bp-* namespaces, their processes, state), also after a crash."""
    need_root("clean")
    if name:
        plan_mod.check_name(name)
    reports = clean_mod.clean(name)
    if as_json:
        click.echo(json.dumps([r.as_dict() for r in reports], indent=2))
        return
    if not reports:
        click.echo("nothing to clean")
    for r in reports:
        click.echo(f"fabric {r.fabric!r}: controller {r.controller}, {len(r.namespaces)} namespaces and "
                   f"{r.processes} processes removed" + (f", root links {r.root_links}" if r.root_links else ""))


def _running_plan(name: str) -> plan_mod.FabricPlan:
    rec = state.read_record(name)
    if rec is None or not rec.alive():
        raise errors.NotRunning(f"no fabric named {name!r} is up (backplane up --name {name})")
    return plan_mod.build(spec.load(rec.topology, spec.parse_dilation(rec.dilation)), name)


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
    from . import measure as measure_mod

    fabric_plan = _running_plan(name)
    port, peer, fiber = find_link(fabric_plan, src, dst, path_index)
    result = measure_mod.link_rate(fabric_plan, src, dst, str(peer.address.ip), port.egress.rate_bps, seconds=seconds,
                                   delay_port=fiber if fiber is not None and _has_delay_lines(name) else None)
    if as_json:
        click.echo(json.dumps(result.as_dict(), indent=2))
        return
    click.echo(f"{src} -> {dst} ({peer.address.ip}): {units.format_rate(result.wire_bps)} on the wire of "
               f"{units.format_rate(result.configured_bps)} configured ({result.ratio:.3f}), "
               f"{result.packets} packets in {seconds:g} s")
    if result.delay_line_drops is not None:
        click.echo(f"the path's delay line (netem on {fiber.node}) dropped {result.delay_line_drops} packets")
    from .telemetry import STEAL_LIMIT

    if result.cpu_steal > STEAL_LIMIT:
        click.echo(f"WARNING: the hypervisor stole {result.cpu_steal:.0%} of this machine's CPU during the "
                   "measurement; shapers stall with it, so this figure understates the link")


@main.group(name="run")
def run_group() -> None:
    """Run a job on a running fabric."""


@run_group.command(name="transfer")
@name_option
@click.argument("src")
@click.argument("dst")
@click.option("--size", default="64MB", show_default=True, help="Bytes to move from each sender, e.g. 256MB.")
@click.option("--qps", type=click.IntRange(1, 1024), default=None, help="Queue pairs per sender [default: the topology's nic.qps_per_pair].")
@click.option("--transport", type=click.Choice(["selective", "go-back-n"]), default=None,
              help="Loss recovery [default: the topology's nic.transport].")
@click.option("--dcqcn", type=click.Choice(list(spec.DCQCN_PROFILES)), default=None,
              help="DCQCN profile the NICs run [default: the topology's nic.dcqcn, with its overrides]. "
                   "The switches keep the ECN thresholds the fabric was started with.")
@click.option("--sample", default=None,
              help="Telemetry period in the real fabric's time: QP rates, alpha and CNPs, and switch queues "
                   "and marks (0: none) [default: 10 ms of wall time, whatever the dilation].")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None,
              help="Write a PNG of rate and queue depth over time here.")
@click.option("--timeout", type=float, default=600.0, show_default=True, help="Give up after this many seconds.")
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
    from . import report
    from .nic import dcqcn as dcqcn_mod
    from .nic import transfer

    fabric_plan = _running_plan(name)
    tm = fabric_plan.spec.time
    try:
        nbytes = units.parse_size(size)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--size")
    try:
        if sample is None:
            period = DEFAULT_SAMPLE_WALL_S
        else:
            period = 0.0 if sample.strip() in ("0", "0s") else tm.time(units.parse_duration(sample))
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--sample")
    nic = fabric_plan.spec.nic
    qps = qps or nic.qps_per_pair
    transport = transport or nic.transport
    srcs = [h for h in src.split(",") if h]
    for host in (*srcs, dst):
        try:
            if fabric_plan.node(host).role != "host":
                raise click.BadParameter(f"{host} is a {fabric_plan.node(host).role}, not a host")
        except KeyError:
            raise click.BadParameter(f"no node {host!r} in fabric {name!r}")
    fspec = fabric_plan.spec
    # The topology's profile with its overrides, or another one as its sources give it.
    profile = (nic.dcqcn_profile(fspec.links.host) if dcqcn in (None, nic.dcqcn)
               else dcqcn_mod.profile(dcqcn, fspec.links.host))
    sampler = (lambda: client.request(name, {"op": "sample"})) if fspec.ecmp.datapath == "ebpf" else None
    marks: list[int] = []  # the fabric's guard watches the run from when the data starts

    def started() -> None:
        marks.append(client.request(name, {"op": "fidelity"})["mark"])

    r = transfer.run(fabric_plan, srcs, dst, nbytes, qps, transport, timeout=timeout,
                     cc=profile, sample_s=period, sampler=sampler, on_start=started)
    machine = client.request(name, {"op": "fidelity", "since": marks[0]})["fidelity"]
    body = r.as_dict()
    body["figures"] = {"ports": report.ports(body),
                       "fairness": report.fairness(body, max(period, 10 * r.rtt_s)) if period else {},
                       "reaction": report.reaction(body)}
    body["fidelity"] = report.fidelity(body, machine)
    if plot_path:
        report.plot(body, plot_path)
    if as_json:
        click.echo(json.dumps(body, indent=2))
    else:
        for line in format_transfer(body):
            click.echo(line)
        if plot_path:
            click.echo(f"  plot: {plot_path}")
    if not (r.intact and r.complete):
        raise errors.MeasurementError("the transfer did not complete intact")


def _tm(body: dict) -> TimeModel:
    return TimeModel.from_dict(body["time_model"])


def format_transfer(body: dict) -> list[str]:
    """The transfer in the real fabric's units: times / d, rates / s, bytes / (s*d)."""
    r = body
    tm = _tm(r)
    line = r["line_rate_bps"]
    dur = lambda wall_s: units.format_duration(tm.real_time(wall_s))  # noqa: E731
    rate = lambda bps: units.format_rate(tm.real_rate(bps))  # noqa: E731
    size = lambda nbytes: units.format_size(tm.real_size(nbytes))  # noqa: E731
    lines = [tm.line(),
             f"{r['src']} -> {r['dst']}: {size(r['size'])} per sender ({units.format_size(r['size'])} emulated) over "
             f"{r['qps']} QPs each, {r['transport']}, RTT {dur(r['rtt_s'])}, line {rate(line)}",
             f"  {'intact' if r['intact'] else 'NOT INTACT'}{'' if r['complete'] else ', INCOMPLETE'}: "
             f"{dur(r['seconds'])} ({r['seconds']:.3f} s of wall time), goodput {rate(r['goodput_bps'])} "
             f"({r['goodput_bps'] / line:.2f} of one host link), {r['data_packets']} packets, "
             f"{r['retransmits']} retransmitted, {r['timeouts']} timeouts, {r['cnps']} CNPs",
             f"  rate control: {r['rate_control']}"]
    delay = r["receiver"]["nic"].get("cnp_delay_s")
    if delay:
        lines.append(f"  CNPs left the receiver {dur(delay['p50'])} (p50; p90 {dur(delay['p90'])}, max "
                     f"{dur(delay['max'])}) after their marked packet arrived")
    react = r.get("figures", {}).get("reaction")
    if react:
        p50s = react["p50_per_sender"]
        if len(p50s) == 1:
            lines.append(f"  the sender cut its rate {dur(p50s[0])} (p50; p90 {dur(react['p90_max'])}, max "
                         f"{dur(react['max'])}) after a CNP arrived")
        else:
            lines.append(f"  senders cut their rates {dur(p50s[0])}-{dur(p50s[-1])} (p50 per sender; "
                         f"p90 up to {dur(react['p90_max'])}) after a CNP arrived")
    if len(r["flows"]) > 1:
        lines.append(f"  {'sender':<16} {'start':>9} {'time':>9} {'goodput':>12} {'retx':>6} {'CNPs':>6}")
        for f in r["flows"]:
            lines.append(f"  {f['src']:<16} {dur(f['started_s']):>9} {dur(f['seconds']):>9} "
                         f"{rate(f['goodput_bps']):>12} {f['retransmits']:>6} {f['cnps_received']:>6}")
    lines.append(f"  {'QPN':>6} {'done':>9} {'packets':>8} {'retx':>6} {'t/o':>4} {'CNPs':>5} {'srtt':>9} {'rto':>9}")
    for s in r["senders"]:
        for q in s["qps"]:
            done = dur(q["completed_s"]) if q["completed_s"] is not None else "-"
            srtt = dur(q["srtt_s"]) if q["srtt_s"] else "-"
            lines.append(f"  {q['qpn']:>#6x} {done:>9} {q['data_packets']:>8} {q['retransmits']:>6} {q['timeouts']:>4} "
                         f"{q['cnps_received']:>5} {srtt:>9} {dur(q['rto_s']):>9}" + (f"  {q['error']}" if q["error"] else ""))
    fig = r.get("figures", {})
    fair = fig.get("fairness") or {}
    if fair.get("jain"):
        settled = (f"reached {0.95} after {dur(fair['fair_after_s'])} ({fair['fair_after_s'] / r['rtt_s']:.0f} RTTs) "
                   "and stayed" if fair["fair_after_s"] is not None else "never stayed at 0.95 or above")
        lines.append(f"  fairness (Jain, {dur(fair['window_s'])} windows while all sent): whole run "
                     f"{fair['jain_whole']:.3f}, lowest window {fair['jain_min']:.3f}; {settled}")
    if fig.get("ports"):
        lines.append(f"  switch queues while all sent ({fig['ports'][0]['samples']} samples), real bytes:")
        lines.append(f"    {'port':<22} {'p50':>8} {'p90':>8} {'p99':>8} {'max':>8} {'marks':>7} {'drops':>6} {'util':>5}")
        for p in fig["ports"][:6]:
            util = f"{p['utilisation']:.2f}" if p["utilisation"] is not None else "-"
            lines.append(f"    {p['port']:<22} " + " ".join(f"{size(p[k]):>8}" for k in
                                                           ("depth_p50", "depth_p90", "depth_p99", "depth_max"))
                         + f" {p['ecn_marks']:>7} {p['buffer_drops']:>6} {util:>5}")
    if r["telemetry"].get("ports_error"):
        lines.append(f"  switch telemetry stopped: {r['telemetry']['ports_error']}")
    drops = {}
    for s in r["senders"]:
        drops.update(s["nic"]["dropped"])
    drops.update({f"rx:{k}": v for k, v in r["receiver"]["nic"]["dropped"].items()})
    if drops:
        lines.append("  refused by the NICs: " + ", ".join(f"{k} {v}" for k, v in sorted(drops.items())))
    sc = r.get("scenario") or {}
    if sc and not sc.get("intra_dc_delay_applied"):
        lines.append(f"  in-DC latency NOT APPLIED (no netem here, or below the emulator's own forwarding): the "
                     f"path's RTT was {dur(r['rtt_s'])} against the topology's {units.format_duration(sc['intra_dc_rtt_s'])}")
    lines += format_fidelity(r.get("fidelity"))
    return lines


def format_fidelity(f: dict | None) -> list[str]:
    if not f:
        return []
    head = "faithful" if f["faithful"] else "NOT FAITHFUL: these figures include the emulator's own limits"
    lines = [f"  fidelity: {head}"]
    for x in f["findings"]:
        lines.append(f"    {'ok ' if x['ok'] else 'NO '} {x['check']}: {x['message']}")
    lines += [f"    NO  machine: {x}" for x in f["machine_limits"]]
    return lines


def _has_delay_lines(name: str) -> bool:
    rec = state.read_record(name)
    return rec is not None and rec.wan_delay


def find_link(fabric_plan: plan_mod.FabricPlan, src: str, dst: str, path_index: int | None):
    """The egress port of ``src`` towards ``dst``, the port that receives on ``dst`` and, for two
    borders joined through a fiber, the fiber's delay-line port towards ``dst`` (else None)."""
    for link in fabric_plan.links:
        for a, b in ((link.a, link.b), (link.b, link.a)):
            if a.node == src and b.node == dst:
                return a, b, None
    # Two borders are neighbours through a fiber: the border's own port is the shaped one.
    wan = [link for link in fabric_plan.links if link.kind == "wan"]
    for link in wan:
        for mine, fiber_in in ((link.a, link.b), (link.b, link.a)):
            if mine.node != src or (path_index is not None and link.path != path_index):
                continue
            for other in wan:
                if other is link or other.path != link.path:
                    continue
                for fiber_out, theirs in ((other.a, other.b), (other.b, other.a)):
                    if theirs.node == dst and fiber_out.node == fiber_in.node:
                        return mine, theirs, fiber_out
    raise errors.BackplaneError(f"{src} and {dst} are not neighbours in fabric {fabric_plan.name!r}")


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
    from . import measure as measure_mod

    fabric_plan = _running_plan(name)
    port, peer, fiber = find_link(fabric_plan, src, dst, path_index)
    if fiber is None:
        raise errors.BackplaneError(f"{src} and {dst} are not joined by long-haul path {path_index}")
    if not _has_delay_lines(name):
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


@main.command()
@name_option
@click.option("--watch", "watch_s", type=float, default=None, metavar="SECONDS",
              help="Print again every SECONDS, with rates over the interval, until Ctrl-C.")
@click.option("--json", "as_json", is_flag=True, help="One JSON document (per interval with --watch).")
@core
def stats(name: str, watch_s: float | None, as_json: bool) -> None:
    """Per-port datapath figures: forwarded, queue depth now and max, ECN marks, drops, fidelity."""
    need_root("stats")
    prev = None
    while True:
        body = client.request(name, {"op": "stats"})["stats"]
        if as_json:
            click.echo(json.dumps(body, indent=None if watch_s else 2), nl=True)
        else:
            for line in format_stats(body, prev):
                click.echo(line)
        if watch_s is None:
            return
        prev = body
        try:
            time.sleep(watch_s)  # the user's chosen reporting interval
        except KeyboardInterrupt:
            return


def format_stats(body: dict, prev: dict | None = None) -> list[str]:
    """Switch ports first, then the long-haul paths' shares, then the fidelity verdict."""
    interval = body["at"] - prev["at"] if prev else None
    before = {(p["node"], p["ifname"]): p for p in prev["ports"]} if prev else {}
    tm = _tm(body)
    lines = [f"fabric {body['name']!r}  datapath {body['datapath']}  hash {body['hash']}", tm.line()]
    if "counters" not in (body["ports"][0] if body["ports"] else {}):
        lines.append("  (kernel datapath: no per-port eBPF counters; qdisc figures only)")
    lines += format_port_table(body["ports"], tm, before, interval)
    fid = body["fidelity"]
    if fid["trustworthy"]:
        lines.append(f"fidelity: ok over the last {fid['interval_s']:.1f} s (softirq {fid['softirq_share']:.0%} of CPU)")
    else:
        lines.append("fidelity: NOT TRUSTWORTHY: these figures include effects the topology does not model")
        lines += [f"  - {limit}" for limit in fid["limits"]]
    return lines


def format_port_table(ports: list[dict], tm: TimeModel, before: dict | None = None,
                      interval: float | None = None) -> list[str]:
    """One line per switch port, then each border's RoCE packets per long-haul path; rates,
    depths and the interval in the real fabric's units (``interval`` is wall seconds)."""
    before = before or {}
    rate = lambda bps: units.format_rate(tm.real_rate(bps))  # noqa: E731
    size = lambda nbytes: units.format_size(tm.real_size(nbytes))  # noqa: E731
    lines = []
    head = (f"  {'port':<20} {'rate':>9} {'tx pkts':>9} {'tx now':>10} {'depth':>8} {'max':>8} {'marks':>7} "
            f"{'buf drop':>8} {'bad pkt':>7} {'qdisc drop':>10}")
    lines.append(head)
    paths = []
    for p in ports:
        if p["role"] not in ("leaf", "spine", "border"):
            continue
        c = p.get("counters") or {}
        q = p.get("queue") or {}
        qd = p.get("qdisc") or {}
        tx_now = ""
        old = before.get((p["node"], p["ifname"]))
        if old and interval and c:
            tx_now = rate((c["tx_bytes"] - old["counters"]["tx_bytes"]) * 8 / interval)
        bad = sum(v for k, v in c.items() if k.startswith("drop_") and k not in ("drop_buffer", "drop_loss"))
        lines.append(
            f"  {p['node'] + ':' + p['ifname']:<20} {rate(p['rate_bps'] or 0):>9} "
            f"{c.get('tx_pkts', qd.get('packets', 0)):>9} {tx_now:>10} {size(q.get('depth_bytes', 0)):>8} "
            f"{size(q.get('max_depth_bytes', 0)):>8} {c.get('ecn_marks', 0):>7} "
            f"{c.get('drop_buffer', 0):>8} {bad:>7} {qd.get('drops', 0):>10}")
        if "wan_path" in p:
            paths.append(p)
    sent = {}
    for p in paths:
        c = p.get("counters") or {}
        sent.setdefault(p["node"], []).append((p["wan_path"], c.get("fwd_pkts", 0)))
    for node, per_path in sent.items():
        total = sum(n for _, n in per_path) or 1
        shares = "  ".join(f"{i}:{n / total:.0%}" for i, n in sorted(per_path))
        lines.append(f"  {node} RoCE packets per long-haul path: {shares}")
    return lines


@main.command(name="set-hash")
@name_option
@click.argument("mode", type=click.Choice(spec.HASH_MODES))
@core
def set_hash(name: str, mode: str) -> None:
    """Change the ECMP hash mode of a running fabric's switches (new packets use it at once)."""
    need_root("set-hash")
    client.request(name, {"op": "set_hash", "hash": mode})
    click.echo(f"fabric {name!r}: switches hash RoCEv2 by {mode}")


@main.command(name="list")
@core
def list_() -> None:
    """Fabrics with a state directory or namespaces on this machine."""
    for name in clean_mod.fabric_names():
        rec = state.read_record(name)
        live = "up" if rec is not None and rec.alive() else "NOT RUNNING (backplane clean)"
        count = len(netns.names(plan_mod.prefix_of(name)))
        click.echo(f"{name:<12} {live:<30} {count} namespaces")


@main.group()
def vm() -> None:
    """The delay tier: a VM with a stock kernel (sch_netem) that runs commands on this checkout."""


def _vm_config(accel: str | None = None, memory: int | None = None) -> "vm_mod.VmConfig":
    return vm_mod.VmConfig.from_env(accel=accel, memory_mb=memory)


def _progress(line: str) -> None:
    click.echo(line, err=True)


@vm.command(name="build")
@click.option("--force", is_flag=True, help="Build again even if the cached root matches.")
@core
def vm_build(force: bool) -> None:
    """Build (or find in the cache) the guest root and its boot files."""
    need_root("vm build")
    start = time.monotonic()
    guest = vm_mod.build(_vm_config(), _progress, force=force)
    click.echo(f"guest root {guest.root} (kernel {guest.kernel_release}) ready in "
               f"{time.monotonic() - start:.1f} s")


@vm.command(name="run", context_settings={"ignore_unknown_options": True})
@click.option("--timeout", "timeout_s", type=float, default=3000.0, show_default=True,
              help="Stop the VM after this many seconds.")
@click.option("--accel", type=click.Choice(["auto", "kvm", "tcg"]), default=None,
              help="auto: KVM when /dev/kvm really boots the guest, else TCG. [env BACKPLANE_VM_ACCEL]")
@click.option("--memory", type=int, default=None, help="Guest memory in MiB. [env BACKPLANE_VM_MEMORY]")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@core
def vm_run(timeout_s: float, accel: str | None, memory: int | None, command: tuple[str, ...]) -> None:
    """Run COMMAND in the checkout inside the VM; its output streams here, its exit code is ours."""
    need_root("vm run")
    config = _vm_config(accel, memory)
    guest = vm_mod.build(config, _progress)
    result = vm_mod.run(config, guest, list(command), lambda line: click.echo(line), timeout_s)
    click.echo(f"[vm] {result.accel}: guest command started {result.boot_s:.1f} s after QEMU, "
               f"VM ran {result.total_s:.1f} s, exit {result.exit_code}", err=True)
    sys.exit(result.exit_code)


@vm.command(name="info")
@click.option("--json", "as_json", is_flag=True)
@core
def vm_info(as_json: bool) -> None:
    """Where the guest root is cached, whether it is built, and which accelerator would be used."""
    config = _vm_config()
    root = vm_mod.root_path(config)
    info = {"cache_dir": str(config.cache_dir), "root": str(root),
            "built": (root / "opt/backplane/kernel-release").is_file(),
            "mirror": config.mirror or vm_mod.host_mirror() or vm_mod.DEFAULT_MIRROR}
    if info["built"] and os.geteuid() == 0:
        guest = vm_mod.build(config, _progress)
        info["kernel_release"] = guest.kernel_release
        info["accel"] = vm_mod.choose_accel(config, guest, _progress)
    if as_json:
        click.echo(json.dumps(info, indent=2))
    else:
        for k, v in info.items():
            click.echo(f"{k:<15} {v}")


if __name__ == "__main__":
    main()
