"""The ``backplane`` group and what every command shares: root check, the --name option, and the
mapping of the core's typed errors to a message on stderr and the error's exit code.
"""
from __future__ import annotations

import functools
import os
import sys

import click

from emulator import errors
from emulator.model import plan as plan_mod


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
        except KeyboardInterrupt:
            # Whatever the command started (NIC processes, a controller being set up) was
            # stopped on the way out; a fabric that is up stays up.
            click.echo("backplane: interrupted", err=True)
            sys.exit(130)

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
