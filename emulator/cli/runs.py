"""``backplane run scenario`` and ``backplane report``: scripted failures on a running fabric,
recorded into a run directory, and that run read back (its figures, the fabric's state at a
moment, its timeline re-plotted) long after the fabric is gone."""
from __future__ import annotations

import json
import time
from pathlib import Path

import click

from emulator.cli.app import core, main, name_option, need_root
from emulator.cli.jobs import run_group
from emulator.cli.text import format_run, format_state
from emulator.model import scenario as scenario_mod, units
from emulator.telemetry import runs, store


@run_group.command(name="scenario")
@name_option
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--out", "out_dir", default=None, help="The run directory [default: runs/NAME-YYYYmmdd-HHMMSS].")
@click.option("--json", "as_json", is_flag=True)
@core
def run_scenario(name: str, file: str, out_dir: str | None, as_json: bool) -> None:
    """Run scenario FILE's workload on fabric NAME, apply its timeline of faults, and record
    every series on one clock into a run directory (Parquet and a JSON manifest), with a
    report and a PNG timeline."""
    need_root("run scenario")
    from emulator.control import scenario_runner  # the workload's modules: netlink, numpy

    scn = scenario_mod.load(file)
    out = Path(out_dir or f"runs/{scn.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    if out.exists() and any(out.iterdir()):
        raise click.BadParameter(f"{out} exists and is not empty: a run directory holds one run", param_hint="--out")
    body = scenario_runner.run(name, scn, out)
    (out / "report.json").write_text(json.dumps(body, indent=2))
    if as_json:
        click.echo(json.dumps(body, indent=2))
        return
    for line in format_run(body):
        click.echo(line)


@main.command()
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.option("--at", "at", default=None, help="Print the fabric's state at this real time from the start, e.g. 40ms.")
@click.option("--plot", "plot_path", default=None, help="Draw the run's timeline again, here.")
@click.option("--json", "as_json", is_flag=True)
@core
def report(run_dir: str, at: str | None, plot_path: str | None, as_json: bool) -> None:
    """A stored run's figures (RUN_DIR from `run scenario`), or its state at --at T."""
    manifest, rows = store.read(run_dir)
    if at is not None:
        try:
            t = units.parse_duration(at)
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="--at") from None
        body = {"time_model": manifest["time_model"], **runs.state_at(manifest, rows, t)}
        lines = format_state(body)
    else:
        body = {"run_dir": run_dir, "time_model": manifest["time_model"], **runs.figures(manifest, rows)}
        lines = format_run(body)
    if plot_path:
        runs.plot(manifest, rows, plot_path)
    if as_json:
        click.echo(json.dumps(body, indent=2))
        return
    for line in lines:
        click.echo(line)
    if plot_path:
        click.echo(f"  plot: {plot_path}")
