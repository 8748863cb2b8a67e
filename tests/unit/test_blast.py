"""The loss instrument's sender (emulator/tools/blast.py): a paced trickle, even when late."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import types

import pytest

from emulator import REPO
from emulator.tools import blast


def test_a_sender_held_up_goes_on_at_its_rate_not_in_a_burst(monkeypatch):
    stamps: list[float] = []

    class Sock:
        def sendto(self, data: bytes, addr: tuple) -> None:
            stamps.append(time.monotonic())

    def sleep(s: float) -> None:
        if len(stamps) == 5 and not held:
            held.append(True)
            time.sleep(0.1)  # the machine holds the process up for 20 packets' time
        time.sleep(s)

    held: list[bool] = []
    monkeypatch.setattr(blast, "socket", types.SimpleNamespace(socket=lambda *a: Sock(), AF_INET=0, SOCK_DGRAM=0))
    monkeypatch.setattr(blast, "time", types.SimpleNamespace(monotonic=time.monotonic, sleep=sleep))
    out = blast.send_count("198.18.0.1", 9, 10, 20, 200.0)  # one every 5 ms
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    assert out["sent_packets"] == 20 and held
    # Never two packets closer than the rate allows: what was missed is not sent in a burst.
    assert all(g >= 0.005 * 0.9 for g in gaps[5:]), gaps



def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _recv(port: int, *flags: str) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-m", "emulator.tools.blast", "recv", "--bind", "127.0.0.1", "--port",
                          str(port), "--warmup", "0", "--seconds", "0.3", "--first-timeout", "0.5", *flags],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO)
    assert p.stdout.readline().strip() == "ready"
    return p


def _result(p: subprocess.Popen) -> dict:
    return json.loads(p.communicate(timeout=10)[0].strip().splitlines()[-1])


@pytest.mark.parametrize("go", [True, False])
def test_a_rate_receiver_that_waits_for_go_outlasts_a_slow_senders_start(go):
    """A sender slower to start than the first packet's timeout (Python under software
    emulation) is not a silent path once the receiver waits for the word; one that does not
    wait gives up."""
    port = _free_port()
    p = _recv(port, *(["--go"] if go else []))
    time.sleep(1.0)  # the sender's start-up: twice the receiver's first timeout
    if not go:
        assert "no packet within 0.5 s" in _result(p)["error"]
        return
    assert p.poll() is None
    p.stdin.write("go\n")
    p.stdin.flush()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        end = time.monotonic() + 0.5
        while time.monotonic() < end:
            s.sendto(bytes(100), ("127.0.0.1", port))
            time.sleep(0.001)
    out = _result(p)
    assert out.get("packets", 0) > 0, out
