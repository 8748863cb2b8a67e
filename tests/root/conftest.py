"""Root tier: whole fabrics in namespaces. Every fabric a test makes is cleaned afterwards."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from emulator.control import clean as clean_mod, client
from emulator.telemetry.cpu import CpuWatch, STEAL_LIMIT

REPO = Path(__file__).resolve().parents[2]
TOPOLOGIES = REPO / "topologies"
# The plots the tests draw, for a person to look at after the run (gitignored).
RESULTS = REPO / "results"

if os.geteuid() != 0:
    pytest.skip("the root tier builds network namespaces: run as root (sudo make test)", allow_module_level=True)


@pytest.fixture(scope="session", autouse=True)
def recover_from_a_crashed_run():
    """A run killed before its own clean-up (CI cancelled, a machine reset) leaves fabrics whose
    controller is gone, and `up` of the same name rightly refuses them: recover those as a user
    would (backplane clean --name), never a fabric whose controller still lives."""
    for name in clean_mod.fabric_names():
        why = clean_mod.health(name)
        if why is not None:
            print(f"[root tier] recovering fabric {name!r} left by a crashed run: {why}")
            clean_mod.clean(name)
    yield


def watch(name: str):
    """The fabric's fidelity monitor over what happens from now: returns a function that gives
    its verdict since (the controller's guard: steal, softirq, CPU pressure, drops outside the
    model, every busy port's dequeue pacing)."""
    mark = client.request(name, {"op": "fidelity"})["mark"]
    return lambda: client.request(name, {"op": "fidelity", "since": mark})["fidelity"]


def stolen(verdict: dict) -> list[str]:
    """What the monitor says the hypervisor took from a run: the one thing outside the project
    that may make a load-sensitive bound inconclusive rather than failed."""
    return [x for x in verdict["limits"] if "hypervisor stole" in x]


def wait_for_quiet(budget_s: float, window_s: float = 0.5) -> None:
    """Return once the hypervisor stole less than the monitor's limit of a window (its bursts
    last tens of seconds), or when the budget is spent; the next run is judged on its own."""
    deadline = time.monotonic() + budget_s
    while time.monotonic() < deadline:
        watch = CpuWatch()
        time.sleep(window_s)  # the window the steal is measured over
        if watch.steal() < STEAL_LIMIT:
            return


def bp(*args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run the backplane CLI as a user would."""
    done = subprocess.run([sys.executable, "-m", "emulator.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)
    if check and done.returncode != 0:
        raise AssertionError(f"backplane {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    return done


def result_path(name: str) -> Path:
    RESULTS.mkdir(exist_ok=True)
    return RESULTS / name


def recorder(name: str, plot: str, title: str) -> subprocess.Popen:
    """``backplane record`` of fabric ``name`` until ``stop_recorder``, plotted to results/PLOT."""
    return subprocess.Popen([sys.executable, "-m", "emulator.cli", "record", "-n", name, "--json", "--title", title,
                             "--plot", str(result_path(plot))], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def stop_recorder(p: subprocess.Popen) -> dict:
    """End a recording as Ctrl-C does, and read what it recorded."""
    said = p.stderr.readline()  # it says so once Ctrl-C ends the recording instead of the process
    assert said.startswith("recording fabric"), said + p.stderr.read()
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    return json.loads(out)


def bp_json(*args: str):
    return json.loads(bp(*args, "--json").stdout)


def nothing_left(name: str) -> dict:
    left = clean_mod.leftovers(name)
    return {k: v for k, v in left.items() if v}


@pytest.fixture
def fabrics():
    """Factory: fabrics(name, topology, *flags) brings one up; all are cleaned at the end."""
    made: list[str] = []

    def up(name: str, topology: str | Path = "tiny", *flags: str) -> str:
        made.append(name)
        path = topology if isinstance(topology, Path) else TOPOLOGIES / f"{topology}.yaml"
        bp("up", str(path), "--name", name, *flags)
        return name

    yield up
    for name in made:
        bp("clean", "--name", name, check=False)
        assert not nothing_left(name), f"fabric {name} left {nothing_left(name)}"
