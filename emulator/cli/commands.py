"""The fabric's life cycle and its figures: doctor, up, status, exec, down, clean, list, stats,
set-hash. The core never prints and raises typed errors; these commands turn results into text
(cli/text.py) or JSON.
"""
from __future__ import annotations

import json
import os
import sys
import time

import click

from emulator import errors, REPO
from emulator.cli.app import core, main, name_option, need_root
from emulator.cli.text import format_port_table, format_stats, format_status, time_model
from emulator.control import client, state
from emulator.model import plan as plan_mod, spec

# The modules that reach the kernel through netlink (pyroute2: 0.2 s to import here, 5 s under
# QEMU without KVM) are imported by the commands that do; those that only ask the controller
# (status, stats, inject, ...) start without them.

DEFAULT_TOPOLOGY = REPO / "topologies" / "cross-dc.yaml"


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@core
def doctor(as_json: bool) -> None:
    """Check what this machine can do, each item with the command that fixes it."""
    from emulator.fabric import capabilities

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
@click.option("--scale", type=float, default=None, metavar="S",
              help="Run every rate x S, replacing the topology's scale: what this machine's CPU keeps up with "
                   "(a QEMU guest without KVM, about 20x slower, needs about 1/200 of the default; raise the "
                   "dilation by as much to keep the bytes).")
@click.option("--json", "as_json", is_flag=True)
@core
def up(topology: str | None, name: str, no_wan_delay: bool, dilation: str | None, scale: float | None,
       as_json: bool) -> None:
    """Build a fabric from TOPOLOGY (default: topologies/cross-dc.yaml) and keep it up."""
    need_root("up")
    from emulator.fabric.checks import check_machine
    from emulator.telemetry.describe import NO_DELAY_WARNING

    path = os.path.abspath(topology) if topology else str(DEFAULT_TOPOLOGY)
    # Bad input fails here, before any effect.
    fabric_plan = plan_mod.build(spec.load(path, spec.parse_dilation(dilation), scale), name)
    check_machine(fabric_plan, wan_delay=not no_wan_delay)
    reply = client.spawn(name, path, wan_delay=not no_wan_delay, dilation=dilation, scale=scale)
    if as_json:
        click.echo(json.dumps(reply, indent=2))
        return
    click.echo(f"fabric {name!r} up in {reply['up_seconds']:.2f} s: {reply['nodes']} nodes, {reply['links']} links "
               f"(controller pid {reply['pid']}, namespaces {plan_mod.prefix_of(name)}*)")
    click.echo(fabric_plan.spec.time.line())
    if fabric_plan.spec.wan_paths and not reply["wan_delay"]:
        click.echo(f"WARNING: {NO_DELAY_WARNING}")
    if reply.get("datapath_build") not in (None, "full"):
        click.echo(f"WARNING: the datapath is its {reply['datapath_build']!r} build: it forwards and models no queue, "
                   "PFC, pacing, ECN or loss (a benchmark's floor)")
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
        for line in format_port_table(body["ports"], time_model(body)):
            click.echo(line)


@main.command(name="exec", context_settings={"ignore_unknown_options": True})
@name_option
@click.argument("node")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@core
def exec_(name: str, node: str, command: tuple[str, ...]) -> None:
    """Run COMMAND inside NODE's namespace: backplane exec east-host0 -- ping 198.18.2.2"""
    need_root("exec")
    from emulator.fabric import netns

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
    from emulator.control import clean as clean_mod

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
@click.option("--name", "-n", default=None, help="Only this fabric (default: every fabric left behind).")
@click.option("--all", "everything", is_flag=True, help="Every fabric of the project, healthy ones too.")
@click.option("--json", "as_json", is_flag=True)
@core
def clean(name: str | None, everything: bool, as_json: bool) -> None:
    """Remove what the project made (bp-* namespaces, their processes, state), also after a
    crash: one fabric with --name; with neither --name nor --all, only while no fabric is up."""
    need_root("clean")
    from emulator.control import clean as clean_mod

    if name:
        plan_mod.check_name(name)
    elif not everything:
        healthy = clean_mod.healthy_names()
        if healthy:
            raise errors.UsageError(
                f"fabric(s) {', '.join(healthy)} are up and healthy, and clean would stop them too: "
                f"clean one fabric (backplane clean --name NAME; `backplane list` says which are stale), "
                f"take one down (backplane down --name {healthy[0]}), or stop everything (backplane clean --all)")
    reports = clean_mod.clean(name)
    if as_json:
        click.echo(json.dumps([r.as_dict() for r in reports], indent=2))
        return
    if not reports:
        click.echo("nothing to clean")
    for r in reports:
        click.echo(f"fabric {r.fabric!r}: controller {r.controller}, {len(r.namespaces)} namespaces and "
                   f"{r.processes} processes removed" + (f", root links {r.root_links}" if r.root_links else ""))


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
    from emulator.control import clean as clean_mod
    from emulator.fabric import netns

    for name in clean_mod.fabric_names():
        stale = clean_mod.health(name)
        count = len(netns.names(plan_mod.prefix_of(name)))
        what = "up" if stale is None else f"STALE: {stale}; backplane clean --name {name}"
        click.echo(f"{name:<12} {count:>3} namespaces  {what}")
