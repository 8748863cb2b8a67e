"""PFC's watchdog and faults on a running fabric: pfcwd (SONiC's verbs) and inject.

Times are the real fabric's, as everywhere: a running fabric dilates them (at faithful a
200 ms detection time takes 800 s of wall time at scale 1/4000).
"""
from __future__ import annotations

import json

import click

from emulator.cli.app import core, main, name_option, need_root
from emulator.cli.text import format_faults, format_pfcwd_config, format_pfcwd_stats
from emulator.control import client
from emulator.model import spec, units


def _parsed(parse, value: str | None, option: str | None):
    if value is None:
        return None
    try:
        return parse(value)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint=option) from None


def _duration(value: str | None, option: str | None = None) -> float | None:
    return _parsed(units.parse_duration, value, option)


@main.group()
def pfcwd() -> None:
    """The PFC watchdog (SONiC pfcwd): a lossless queue paused without draining for the detection
    time is stormed and its action taken; restoration time without PAUSE restores it."""


@pfcwd.command()
@name_option
@click.option("--action", type=click.Choice(spec.PFC_WATCHDOG_ACTIONS), default=None,
              help="drop: its queued and arriving packets and ignore its PAUSEs; forward: ignore its "
                   "PAUSEs; alert: count only [default: the topology's].")
@click.option("--detection-time", default=None, help="e.g. 200ms (the real fabric's time).")
@click.option("--restoration-time", default=None, help="e.g. 200ms.")
@click.option("--poll-interval", default=None, help="How often it looks, e.g. 200ms.")
@core
def start(name: str, action: str | None, detection_time: str | None, restoration_time: str | None,
          poll_interval: str | None) -> None:
    """Start the watchdog on every lossless queue of the switches."""
    need_root("pfcwd start")
    r = client.request(name, {"op": "pfcwd", "cmd": "start", "action": action,
                              "detection_s": _duration(detection_time),
                              "restoration_s": _duration(restoration_time), "poll_s": _duration(poll_interval)})
    for line in format_pfcwd_config(r["config"]):
        click.echo(line)


@pfcwd.command()
@name_option
@core
def stop(name: str) -> None:
    """Stop the watchdog; stormed queues are restored."""
    need_root("pfcwd stop")
    client.request(name, {"op": "pfcwd", "cmd": "stop"})
    click.echo(f"fabric {name!r}: PFC watchdog stopped")


@pfcwd.group()
def show() -> None:
    """The watchdog's config and stats."""


def _show(name: str, cmd: str, as_json: bool, pick, fmt) -> None:
    need_root(f"pfcwd show {cmd}")
    r = client.request(name, {"op": "pfcwd", "cmd": cmd})
    if as_json:
        click.echo(json.dumps(pick(r), indent=2))
        return
    for line in fmt(r[cmd]):
        click.echo(line)


@show.command()
@name_option
@click.option("--json", "as_json", is_flag=True)
@core
def config(name: str, as_json: bool) -> None:
    """Action, detection, restoration and poll times."""
    _show(name, "config", as_json, lambda r: r["config"], format_pfcwd_config)


@show.command(name="stats")
@name_option
@click.option("--json", "as_json", is_flag=True)
@core
def show_stats(name: str, as_json: bool) -> None:
    """Per lossless queue: STATUS, STORM DETECTED/RESTORED, TX OK/DROP, RX OK/DROP."""
    _show(name, "stats", as_json, lambda r: {"stats": r["stats"], "storms": r["storms"]}, format_pfcwd_stats)


@main.group()
def inject() -> None:
    """Faults on a running fabric."""


@inject.command(name="pfc-storm")
@name_option
@click.argument("node")
@click.option("--port", "ifname", default=None, help="The port that storms (a host's only port by default).")
@click.option("--priority", type=click.IntRange(0, 7), default=None, help="[default: the topology's lossless one]")
@click.option("--for", "for_", default=None, help="How long, e.g. 1ms (the real fabric's time); default: until --stop.")
@click.option("--stop", is_flag=True, help="End a storm started without --for.")
@click.option("--json", "as_json", is_flag=True)
@core
def pfc_storm(name: str, node: str, ifname: str | None, priority: int | None, for_: str | None, stop: bool,
              as_json: bool) -> None:
    """Make NODE's port send PAUSE continuously, as a stuck NIC does."""
    need_root("inject pfc-storm")
    request = {"op": "inject", "kind": "pfc-storm", "node": node, "ifname": ifname, "for_s": _duration(for_),
               "stop": stop}
    if priority is not None:
        request["priority"] = priority
    r = client.request(name, request)
    if as_json:
        click.echo(json.dumps(r["storm"], indent=2))
        return
    storm = r["storm"]
    if storm is None:
        click.echo(f"no storm running on {node}")
    elif stop:
        click.echo(f"{storm['port']}: PFC storm on priority {storm['prio']} stopped after {storm['frames']} frames")
    else:
        until = "until stopped (backplane inject pfc-storm --stop)" if storm["until"] is None else \
            f"for {for_}"
        click.echo(f"{storm['port']}: sending PAUSE on priority {storm['prio']} {until}")


_detection = click.option("--detection", default=None,
                          help="How long the control plane takes to notice (BFD-like), real time "
                               "[default: 150ms, 3 x 50 ms].")


def _apply(name: str, kind: str, target: str, as_json: bool, detection: str | None, **extra) -> None:
    need_root(f"inject {kind}")
    r = client.request(name, {"op": "inject", "kind": kind, "target": target, "detection_s": _duration(detection),
                              **extra})
    if as_json:
        click.echo(json.dumps(r, indent=2))
        return
    if kind == "restore":
        for f in r["fault"]["restored"]:
            click.echo(f"fault {f['id']} ({f['kind']} {f['target']}) restored: {', '.join(f['ports'])} up; ECMP "
                       "takes them back after the detection time")
        return
    f = r["fault"]
    if "detection_s" in f["options"]:
        click.echo(f"fault {f['id']}: {kind} {target}: {', '.join(f['ports'])} down; ECMP withdraws them after "
                   f"{units.format_duration(f['options']['detection_s'])} (real)")
    else:
        click.echo(f"fault {f['id']}: {kind} {target} on {', '.join(f['ports'])}, until `inject restore {target}`")


@inject.command(name="fiber-cut")
@name_option
@click.argument("path")
@_detection
@click.option("--json", "as_json", is_flag=True)
@core
def fiber_cut(name: str, path: str, detection: str | None, as_json: bool) -> None:
    """Cut long-haul PATH (wan0, wan1, ...): both directions, until `inject restore PATH`."""
    _apply(name, "fiber-cut", path, as_json, detection)


@inject.command(name="link-flap")
@name_option
@click.argument("target")
@click.option("--count", type=click.IntRange(1, 10_000), default=1, show_default=True, help="Down-up cycles.")
@click.option("--period", required=True, help="One cycle (down half, up half), real time, e.g. 2ms.")
@_detection
@click.option("--json", "as_json", is_flag=True)
@core
def link_flap(name: str, target: str, count: int, period: str, detection: str | None, as_json: bool) -> None:
    """Take TARGET (a long-haul path, or a switch port NODE:IFNAME and its far end) down and up."""
    _apply(name, "link-flap", target, as_json, detection, count=count, period_s=_duration(period, "--period"))


@inject.command(name="switch-failure")
@name_option
@click.argument("node")
@_detection
@click.option("--json", "as_json", is_flag=True)
@core
def switch_failure(name: str, node: str, detection: str | None, as_json: bool) -> None:
    """Fail switch NODE: every port of it down, until `inject restore NODE`."""
    _apply(name, "switch-failure", node, as_json, detection)


@inject.command(name="restore")
@name_option
@click.argument("target")
@click.option("--json", "as_json", is_flag=True)
@core
def restore(name: str, target: str, as_json: bool) -> None:
    """Undo the faults on TARGET (the path, port or switch they were applied to), or all."""
    _apply(name, "restore", target, as_json, None)


@main.command()
@name_option
@click.option("--json", "as_json", is_flag=True)
@core
def faults(name: str, as_json: bool) -> None:
    """The faults applied to a running fabric, each with its timeline: taken effect, withdrawn
    from ECMP (converged), restored, back in ECMP."""
    need_root("faults")
    r = client.request(name, {"op": "faults"})
    if as_json:
        click.echo(json.dumps(r, indent=2))
        return
    for line in format_faults(r):
        click.echo(line)


@inject.command(name="rate")
@name_option
@click.argument("target")
@click.option("--rate", required=True, help="The degraded rate, the real fabric's, e.g. 100Gbps.")
@click.option("--json", "as_json", is_flag=True)
@core
def rate(name: str, target: str, rate: str, as_json: bool) -> None:
    """Degrade TARGET (a long-haul path, both ways, or a switch port NODE:IFNAME) to RATE."""
    _apply(name, "rate", target, as_json, None, rate_bps=_parsed(units.parse_rate, rate, "--rate"))


@inject.command(name="ber")
@name_option
@click.argument("path")
@click.option("--ber", default=None, help="Bit error rate, e.g. 1e-6.")
@click.option("--corruption", default=None, help="Or: the share of packets corrupted.")
@click.option("--loss", default=None, help="Or: the share of packets lost.")
@click.option("--json", "as_json", is_flag=True)
@core
def ber(name: str, path: str, ber: str | None, corruption: str | None, loss: str | None, as_json: bool) -> None:
    """Bit errors (or loss) on long-haul PATH, both ways: netem where the fibers have delay lines,
    the borders' eBPF elsewhere (a corrupted frame fails the ICRC: loss to RoCE)."""
    _apply(name, "ber", path, as_json, None, ber=_parsed(units.parse_probability, ber, "--ber"),
           corruption=_parsed(units.parse_probability, corruption, "--corruption"),
           loss=_parsed(units.parse_probability, loss, "--loss"))


@inject.command(name="latency-step")
@name_option
@click.argument("path")
@click.option("--extra", required=True, help="The distance the re-routed path adds, e.g. 200km.")
@click.option("--json", "as_json", is_flag=True)
@core
def latency_step(name: str, path: str, extra: str, as_json: bool) -> None:
    """Re-route long-haul PATH by EXTRA distance (its delay lines grow; needs them: the VM tier)."""
    _apply(name, "latency-step", path, as_json, None, extra_m=_parsed(units.parse_distance, extra, "--extra"))
