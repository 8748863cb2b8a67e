"""Talking to a fabric's controller: start it, ask it, stop it."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

from emulator import REPO
from emulator.control import state
from emulator.model import plan as plan_mod, spec
from emulator.model.plan import FabricPlan
from emulator.errors import AlreadyRunning, BackplaneError, FabricError, NotRunning



class RemoteError(BackplaneError):
    """An error the controller raised, with its message and exit code."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def _raise_reply(reply: dict) -> None:
    raise RemoteError(reply.get("error", "the controller failed without saying why"),
                      int(reply.get("exit_code", 1)))


def request(name: str, payload: dict, timeout: float = 120) -> dict:
    path = state.socket_path(name)
    if not path.exists():
        rec = state.read_record(name)
        if rec is not None and not rec.alive():
            raise NotRunning(f"the controller of fabric {name!r} (pid {rec.pid}) is gone; "
                             f"remove what it left: backplane clean --name {name}")
        raise NotRunning(f"no fabric named {name!r} is up (backplane up --name {name})")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(str(path))
        sock.sendall(json.dumps(payload).encode() + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = sock.recv(1 << 16)
            if not chunk:
                break
            data += chunk
    except (ConnectionRefusedError, FileNotFoundError):
        raise NotRunning(f"the controller of fabric {name!r} does not answer; backplane clean --name {name}") from None
    except (ConnectionResetError, BrokenPipeError):
        # It closed its socket with this request in it: it is going down.
        raise NotRunning(f"the controller of fabric {name!r} closed the connection without answering") from None
    except socket.timeout:
        raise FabricError(f"the controller of fabric {name!r} did not answer within {timeout:g} s") from None
    finally:
        sock.close()
    if not data:
        raise NotRunning(f"the controller of fabric {name!r} closed the connection without answering")
    reply = json.loads(data)
    if not reply.get("ok"):
        _raise_reply(reply)
    return reply


@dataclass(frozen=True)
class RunningFabric:
    """A running fabric as its controller built it."""

    plan: FabricPlan
    wan_delay: bool  # its long-haul paths have their delay lines (netem)


def running(name: str) -> RunningFabric:
    """The running fabric ``name``: its plan built from the very topology text and dilation its
    controller was built from (the file may have changed since ``up``)."""
    reply = request(name, {"op": "plan"})
    fabric_spec = spec.from_text(reply["topology"], reply["source"], spec.parse_dilation(reply["dilation"]),
                                 reply.get("scale"))
    return RunningFabric(plan_mod.build(fabric_spec, name), bool(reply["wan_delay"]))


def _stdlib_distutils() -> bool:
    """Whether this Python still has its own distutils (before 3.12; Debian packages it apart)."""
    return (Path(sysconfig.get_paths()["stdlib"]) / "distutils" / "version.py").is_file()


def spawn(name: str, topology: str, wan_delay: bool, timeout: float = 600, dilation: str | None = None,
          scale: float | None = None) -> dict:
    """Start a controller for fabric ``name`` and wait until it reports the fabric up or failed."""
    rec = state.read_record(name)
    if rec is not None:
        if rec.alive():
            raise AlreadyRunning(f"fabric {name!r} is already up (controller pid {rec.pid}); backplane down --name {name}")
        raise AlreadyRunning(f"fabric {name!r} was left by a controller that died (pid {rec.pid}); "
                             f"backplane clean --name {name}")
    d = state.fabric_dir(name)
    d.mkdir(parents=True, exist_ok=True)
    log = open(state.log_path(name), "w")
    r, w = os.pipe()
    argv = [sys.executable, "-m", "emulator.control.controller", "--name", name, "--topology", topology,
            "--ready-fd", str(w)]
    if not wan_delay:
        argv.append("--no-wan-delay")
    if dilation is not None:
        argv += ["--dilation", dilation]
    if scale is not None:
        argv += ["--scale", repr(scale)]
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    if _stdlib_distutils() and "SETUPTOOLS_USE_DISTUTILS" not in env:
        # Mininet imports distutils.version; setuptools' stand-in for it loads setuptools and
        # pkg_resources whole (0.15 s here, 4.5 s under QEMU without KVM), the standard one nothing.
        env["SETUPTOOLS_USE_DISTUTILS"] = "stdlib"
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, pass_fds=(w,),
                                start_new_session=True, cwd="/", env=env)
    finally:
        os.close(w)
        log.close()
    try:
        with os.fdopen(r) as ready:
            line = ready.readline()
    except KeyboardInterrupt:
        stop_controller(proc.pid)
        raise
    if not line:
        proc.wait(timeout=30)
        tail = state.log_path(name).read_text()[-2000:] if state.log_path(name).exists() else ""
        raise FabricError(f"the controller exited ({proc.returncode}) before the fabric was up:\n{tail}")
    reply = json.loads(line)
    if not reply.get("ok"):
        proc.wait(timeout=timeout)
        _raise_reply(reply)
    return reply


def wait_controller_exit(name: str, rec: state.ControllerRecord, timeout: float = 30) -> None:
    """After ``down`` answered: let the controller finish on its own, kill it only if it hangs."""
    deadline = time.monotonic() + timeout
    while rec.alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    if rec.alive():
        stop_controller(rec.pid)
    state.remove(name)


def stop_controller(pid: int, timeout: float = 30) -> None:
    from emulator.fabric import netns

    netns.kill_pids([pid], timeout=timeout)
