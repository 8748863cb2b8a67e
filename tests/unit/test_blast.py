"""The loss instrument's sender (emulator/tools/blast.py): a paced trickle, even when late."""
from __future__ import annotations

import time
import types

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
