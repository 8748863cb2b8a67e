"""The ``backplane`` command: thin click commands over the core, and the text they print.

app: the group, the --name option, errors to exit codes; commands: the fabric's life cycle and
figures; faults: the PFC watchdog and injected faults; jobs: measure, run and record; runs: scenarios and
their stored runs; vm: the delay tier's VM; text: every line printed, tested alone.
"""
from emulator.cli import commands, faults, jobs, runs, vm  # noqa: F401 - each registers its commands on main
from emulator.cli.app import main

__all__ = ["main"]
