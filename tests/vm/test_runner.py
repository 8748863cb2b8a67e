"""The VM runner as users drive it: `backplane vm run` boots the guest, streams, returns the exit
code, and never leaves a VM behind (timeout, Ctrl-C). Needs root, QEMU and the guest root, which
`make vm-test` builds before running these."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

if os.geteuid() != 0:
    pytest.skip("the VM runner needs root (sudo make vm-test)", allow_module_level=True)


def ours() -> set[int]:
    """QEMU processes of backplane's VM runner (they share a folder tagged `run`)."""
    pids = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmd = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if cmd and cmd[0].endswith(b"qemu-system-x86_64") and any(b"mount_tag=run" in a for a in cmd):
                pids.add(int(entry.name))
    return pids


def vm_run(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "emulator.cli", "vm", "run", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(autouse=True)
def no_vm_left():
    before = ours()
    yield
    assert ours() <= before, "a VM was left running"


def test_command_output_streams_back_and_its_exit_code_is_ours():
    done = vm_run("--", "sh", "-c", "echo hello from $(uname -r); ip -o link show; exit 7")
    assert done.returncode == 7, done.stderr
    assert "hello from" in done.stdout
    # -nic none: the guest's only interface is its loopback.
    links = [line for line in done.stdout.splitlines() if ": <" in line]
    assert len(links) == 1 and ": lo: " in links[0], done.stdout


def test_the_guest_kernel_has_netem_and_sees_the_live_checkout(tmp_path):
    marker = REPO / f".vm-test-marker-{os.getpid()}"
    marker.write_text("written on the host\n")
    try:
        done = vm_run("--", "sh", "-c", f"cat {marker.name}; tc qdisc add dev lo root netem delay 1ms && echo netem-ok")
    finally:
        marker.unlink()
    assert done.returncode == 0, done.stdout + done.stderr
    assert "written on the host" in done.stdout and "netem-ok" in done.stdout


def test_timeout_stops_the_vm():
    done = vm_run("--timeout", "20", "--", "sleep", "600")
    assert done.returncode == 8, done.stderr
    assert "did not finish within 20 s" in done.stderr


def test_ctrl_c_stops_the_vm():
    # As from a terminal: a shell without job control starts background commands with SIGINT
    # ignored (CI started so), and Python then leaves it ignored, Ctrl-C or not.
    proc = subprocess.Popen([sys.executable, "-m", "emulator.cli", "vm", "run", "--", "sh", "-c",
                             "echo guest-is-running; sleep 600"], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        for line in proc.stdout:  # wait for the guest to run the command, not for a timer
            if "guest-is-running" in line:
                break
        assert ours(), "no VM while the guest command runs"
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            vms = ours()
            proc.kill()
            _, err = proc.communicate()
            raise AssertionError(f"the runner still ran 30 s after Ctrl-C (its VMs then: {vms}); it said:\n{err}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0



def test_a_killed_runner_takes_its_vm_with_it():
    proc = subprocess.Popen([sys.executable, "-m", "emulator.cli", "vm", "run", "--", "sh", "-c",
                             "echo guest-is-running; sleep 600"], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    try:
        for line in proc.stdout:
            if "guest-is-running" in line:
                break
        vms = ours()
        assert vms
        proc.kill()
        proc.wait()
        # The kernel sends QEMU its parent-death signal; poll for the condition, with a deadline.
        deadline = time.monotonic() + 15
        while ours() & vms and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not ours() & vms, "the VM outlived its killed runner"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
