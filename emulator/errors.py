"""Typed errors of the core, each with the exit code the CLI maps it to.

The core never prints: it raises one of these, and the CLI turns it into a message and an exit
code, so scripts can tell a bad topology from a missing kernel feature from a fabric that is down.
"""
from __future__ import annotations


class BackplaneError(Exception):
    """Base of every error the core raises on purpose."""

    exit_code = 1


class UsageError(BackplaneError):
    """A command was asked for something that cannot be (a host that is not one, a size of 0):
    refused before any work starts."""

    exit_code = 2


class SpecError(BackplaneError):
    """A topology file is malformed: names the file, the key path and what is wrong."""

    exit_code = 2

    def __init__(self, file: str, path: str, message: str) -> None:
        self.file = file
        self.path = path
        self.message = message
        where = f"{file}: {path}" if path else file
        super().__init__(f"{where}: {message}")


class CapabilityError(BackplaneError):
    """The machine lacks something the request needs; says what and the command that fixes it."""

    exit_code = 3

    def __init__(self, what: str, fix: str) -> None:
        self.what = what
        self.fix = fix
        super().__init__(f"{what}\n  fix: {fix}")


class FabricError(BackplaneError):
    """Building, checking or tearing down a fabric failed; the fabric is not trustworthy."""

    exit_code = 4


class NotRunning(BackplaneError):
    """No live controller answers for the fabric named."""

    exit_code = 5


class AlreadyRunning(BackplaneError):
    """A fabric with that name is already up (or left behind by a crash)."""

    exit_code = 6


class MeasurementError(BackplaneError):
    """A measurement could not be made (no reply, tool failed); never replaced by a guess."""

    exit_code = 7
