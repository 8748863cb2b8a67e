"""How the CLI fails, as a user meets it: every failure of `run transfer` and its neighbours gives
a one-line cause and the right exit code (2 bad input, 5 not up, 7 measurement failed), never a
traceback; bad arguments are refused before any work starts; a dead soft-NIC is named with how
it ended; and `clean` without a name leaves healthy fabrics alone."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from emulator.control import state
from emulator.fabric import netns
from emulator.model import plan as plan_mod
from .conftest import REPO, bp

SRC, DST = "east-host0", "west-host0"
BIG = "256MB"  # several seconds on tiny.yaml's links: time to act on it while it runs


def failed(done: subprocess.CompletedProcess, code: int, *words: str) -> str:
    """Assert the CLI exited ``code`` with a message holding ``words`` and no traceback."""
    out = done.stdout + done.stderr
    assert done.returncode == code, f"exit {done.returncode}, expected {code}:\n{out}"
    assert "Traceback" not in out, out
    for w in words:
        assert w in out, f"{w!r} not in:\n{out}"
    return out


def _interruptible() -> None:
    # A shell without job control starts background commands with SIGINT ignored, and Python then
    # leaves it so: the CLI runs here as from a terminal, where Ctrl-C reaches it.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_transfer(name: str, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "emulator.cli", "run", "transfer", "-n", name, SRC, DST,
                             "--size", BIG, "--qps", "2", *extra], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=_interruptible)


def workers(name: str) -> dict[str, int]:
    """The transfer's soft-NIC processes in fabric ``name``: "sender"/"target" -> pid."""
    out = {}
    prefix = plan_mod.prefix_of(name)
    for pid in netns.pids_in(netns.names(prefix)):
        try:
            argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        if b"emulator.workload.worker" in argv:
            out["sender" if b"send" in argv else "target"] = pid
    return out


def data_flowing(name: str, budget_s: float = 60) -> dict[str, int]:
    """Wait until both soft-NICs run and the data moves (the sender's link counts bytes)."""
    deadline = time.monotonic() + budget_s
    ns = plan_mod.prefix_of(name) + SRC
    while time.monotonic() < deadline:
        w = workers(name)
        if len(w) == 2:
            before = _tx_bytes(ns)
            time.sleep(0.2)
            if _tx_bytes(ns) - before > 1_000_000:
                return w
        time.sleep(0.05)
    raise AssertionError(f"the transfer's data never flowed in {budget_s} s: {workers(name)}")


def _tx_bytes(ns: str) -> int:
    done = netns.run(ns, ["cat", "/sys/class/net/eth0/statistics/tx_bytes"])
    return int(done.stdout)


def no_workers_left(name: str, budget_s: float = 10) -> bool:
    deadline = time.monotonic() + budget_s
    while workers(name) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not workers(name)


def test_bad_arguments_are_refused_before_any_work(fabrics, tmp_path):
    name = fabrics("fbad", "tiny", "--no-wan-delay")
    cases = [
        (["--size", "1TB"], "of memory"),
        (["--size", "0B"], "at least one byte"),
        (["--timeout", "-1"], "--timeout"),
        (["--plot", "/no/such/dir/x.png"], "no folder /no/such/dir"),
        (["--qps", "0"], "--qps"),
    ]
    for extra, words in cases:
        started = time.monotonic()
        done = bp("run", "transfer", "-n", name, SRC, DST, *extra, check=False)
        failed(done, 2, words)
        assert time.monotonic() - started < 20 and not workers(name), extra  # refused before starting
    failed(bp("run", "transfer", "-n", name, SRC, SRC, check=False), 2, "cannot send to itself")
    failed(bp("run", "transfer", "-n", name, SRC, "east-leaf0", check=False), 2, "east-leaf0 is a leaf, not a host")
    failed(bp("run", "transfer", "-n", name, SRC, "nowhere", check=False), 2, "no node 'nowhere'")
    failed(bp("measure", "link", "-n", name, "east-border0", "west-border0", "--path", "99", check=False), 2,
           "no long-haul path 99", "its paths: 0, 1")
    failed(bp("run", "transfer", "-n", "nofabric", SRC, DST, check=False), 5, "no fabric named 'nofabric' is up")


@pytest.mark.parametrize("role", ["sender", "target"])
def test_a_soft_nic_killed_mid_transfer_is_named_with_how_it_ended(fabrics, role):
    name = fabrics(f"fk{role[0]}", "tiny", "--no-wan-delay")
    run = start_transfer(name)
    pids = data_flowing(name)
    os.kill(pids[role], signal.SIGKILL)
    out, err = run.communicate(timeout=120)
    host = SRC if role == "sender" else DST
    failed(subprocess.CompletedProcess(run.args, run.returncode, out, err), 7,
           f"the soft-NIC on {host} ({role}) was killed by SIGKILL during the transfer")
    assert no_workers_left(name), workers(name)


def test_a_sender_killed_during_set_up_is_named_without_a_traceback(fabrics):
    name = fabrics("fks", "tiny", "--no-wan-delay")
    run = start_transfer(name)
    deadline = time.monotonic() + 60
    while "sender" not in workers(name) and time.monotonic() < deadline:
        time.sleep(0.005)
    os.kill(workers(name)["sender"], signal.SIGKILL)  # within milliseconds of its start
    out, err = run.communicate(timeout=120)
    text = failed(subprocess.CompletedProcess(run.args, run.returncode, out, err), 7,
                  f"the soft-NIC on {SRC} (sender) was killed by SIGKILL")
    assert "(sender) was killed by SIGKILL before it was ready" in text or "being connected" in text \
        or "during the transfer" in text, text
    assert no_workers_left(name), workers(name)


def test_ctrl_c_during_set_up_stops_the_nics_and_says_so(fabrics):
    name = fabrics("fint", "tiny", "--no-wan-delay")
    run = start_transfer(name)
    deadline = time.monotonic() + 60
    while not workers(name) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert workers(name), "no soft-NIC started"
    run.send_signal(signal.SIGINT)
    out, err = run.communicate(timeout=60)
    failed(subprocess.CompletedProcess(run.args, run.returncode, out, err), 130, "interrupted")
    assert no_workers_left(name), workers(name)
    assert bp("status", "-n", name, "--no-rtt").returncode == 0  # the fabric stays up


def test_down_during_a_transfer_says_the_fabric_went_away(fabrics):
    name = fabrics("fdown", "tiny", "--no-wan-delay")
    run = start_transfer(name)
    data_flowing(name)
    bp("down", "-n", name)
    out, err = run.communicate(timeout=120)
    failed(subprocess.CompletedProcess(run.args, run.returncode, out, err), 7,
           f"fabric '{name}' went away during the transfer (taken down)")


def test_a_controller_killed_mid_transfer_cuts_the_switch_figures_and_says_where(fabrics):
    """The switches keep forwarding (their programs stay attached), so the data arrives; the
    port readings stop where the controller died, and the report says so and fails with 7."""
    name = fabrics("fctl", "tiny", "--no-wan-delay")
    run = start_transfer(name)
    data_flowing(name)
    os.kill(state.read_record(name).pid, signal.SIGKILL)
    out, err = run.communicate(timeout=300)
    text = failed(subprocess.CompletedProcess(run.args, run.returncode, out, err), 7,
                  "its switch figures are incomplete", "switch telemetry CUT OFF after")
    assert "intact" in text and "NOT INTACT" not in text
    # What a user meets next: the fabric is stale, named so, with the command that cleans it.
    failed(bp("run", "transfer", "-n", name, SRC, DST, check=False), 5, f"backplane clean --name {name}")
    listing = bp("list").stdout
    assert "STALE: its controller (pid " in listing and f"backplane clean --name {name}" in listing


def test_clean_without_a_name_leaves_healthy_fabrics_alone(fabrics):
    name = fabrics("fcln", "tiny", "--no-wan-delay")
    failed(bp("clean", check=False), 2, f"fabric(s) {name}", "backplane clean --all")
    assert bp("status", "-n", name, "--no-rtt").returncode == 0
    assert f"{name} " in bp("list").stdout


WAN = "wan:\n  paths: 2\n  distance: 3000km\n  rate: 400Gbps\n"


@pytest.mark.parametrize("doc,words", [
    (f"{WAN}  loss: 1\n", "wan.loss: 1 would drop every packet; for one percent write '1%'"),
    (f"{WAN}  paths: 4\n", "wan.paths: given twice (lines"),
    (f"{WAN}ecn: {{kmin: 200KB, kmax: 5KB}}\n", "ecn.kmax: kmax 5KB (set in ecn) is below kmin 200KB"),
])
def test_up_refuses_a_bad_topology_naming_file_and_key(tmp_path, doc, words):
    path = tmp_path / "bad.yaml"
    path.write_text("version: 1\nscale: 0.001\ndatacenters:\n  - {name: east, spines: 1, leaves: 1, hosts_per_leaf: 1}\n"
                    "  - {name: west, spines: 1, leaves: 1, hosts_per_leaf: 1}\n" + doc)
    failed(bp("up", str(path), "--name", "fbadtopo", "--no-wan-delay", check=False), 2, f"{path}: {words}")
    assert not netns.names(plan_mod.prefix_of("fbadtopo"))  # nothing was built


def test_up_refuses_a_binary_file(tmp_path):
    path = tmp_path / "topology.yaml"
    path.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff")
    failed(bp("up", str(path), "--name", "fbadtopo", check=False), 2, f"{path}: not a text file")
