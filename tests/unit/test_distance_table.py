"""bench/distance.py's table from saved rows: the ratios, the model beside them, the compute at
which the distance becomes nearly free, and the sentences that say when a figure is the
emulator's rather than the fabric's."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from emulator.workload import collectives as C

SPEC = importlib.util.spec_from_file_location("distance", Path(__file__).resolve().parents[2] / "bench" / "distance.py")
distance = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(distance)

TM = {"scale": 5e-6, "dilation": 200.0, "preset": None}


def row(topology: str, profile: str, real: int, time_real: float, model_real: float, busbw_share: float = 0.95,
        loss: float = 0.0) -> dict:
    d = TM["dilation"]
    hosts = ["east-host0", "east-host1", "west-host0", "west-host1"] if topology == "cross-dc" else \
        [f"local-host{i}" for i in range(4)]
    rtt = [4e-6, 30e-3, 4e-6, 30e-3] if topology == "cross-dc" else [4e-6] * 4
    return {"topology": topology, "loss": loss, "profile": profile, "real_size": real, "time_s": time_real * d,
            "model_s": model_real * d, "time_model": TM, "intact": True, "hosts": hosts, "iters": 1,
            "data_packets": 600, "alpha_s": max(rtt) / 2 * d, "size": real // 1000, "busbw_bps": busbw_share * 2e6,
            "line_rate_bps": 2e6, "hop_rtts_s": {f"{a}->{b}": x * d for a, b, x in zip(hosts, hosts[1:] + hosts[:1], rtt)}}


@pytest.mark.parametrize("overlap", [0.0, 0.5, 1.0])
def test_break_even_is_the_least_compute_at_which_the_step_is_within_ten_percent(overlap):
    single, cross = 0.030, 0.120
    t = distance.break_even(single, cross, overlap)
    ratio = lambda c: C.step(c, cross, overlap).step_s / C.step(c, single, overlap).step_s  # noqa: E731
    assert ratio(t) <= distance.FREE + 1e-9
    assert ratio(t * 0.99) > distance.FREE


def test_the_table_gives_ratios_beside_the_model_and_says_when_the_run_was_cpu_bound():
    rows = [row("single-dc", "meta", 10 ** 9, 0.040, 0.030, busbw_share=0.7),
            row("cross-dc", "meta", 10 ** 9, 0.140, 0.120)]
    text = distance.table(rows, 0.1, 0.5)
    line = next(x for x in text.splitlines() if x.startswith("meta"))
    assert "40ms" in line and "140ms" in line and " 3.50 " in line and " 4.00 " in line
    # The ring-path model: a chunk of a 4-ring with two crossings crosses 3 times in its 6 steps, not 6.
    assert "pays only the 3 crossings on a chunk's way (45ms" in text
    assert "CPU-BOUND: single-DC meta" in text
    assert "free when: meta" in text and "answer:" in text
    assert "within 10% of one DC's only from 30GB at 400Gbps a link" in text  # 4 x 50 GB/s x (15 ms - 1.1 x 2 us) / 0.1


def test_a_single_dc_run_far_above_the_model_is_called_the_emulators_floor():
    rows = [row("single-dc", "seed", 10 ** 6, 0.006, 0.00006), row("cross-dc", "seed", 10 ** 6, 0.064, 0.09)]
    text = distance.table(rows, 0.1, 0.5)
    assert "FLOOR: single-DC seed 1MB" in text
    assert "CPU-BOUND" not in text  # only the largest size says how far the line was reached


def test_a_frame_is_lost_when_any_of_the_real_packets_it_stands_for_would_be():
    from emulator.model.timemodel import TimeModel
    tm = TimeModel.from_dict(TM)  # s*d = 1e-3: a frame holds a thousand real frames' bytes
    assert distance.frame_loss(0.0, tm) == 0.0
    assert distance.frame_loss(1e-4, tm) == pytest.approx(1 - (1 - 1e-4) ** 1000)  # about 0.095
    assert distance.frame_loss(1e-6, tm) == pytest.approx(1e-3, rel=1e-3)
    faithful = TimeModel.of(1e-3, "faithful")
    assert distance.frame_loss(1e-4, faithful) == pytest.approx(1e-4)


def test_a_run_that_did_not_complete_intact_gives_no_figure_to_the_answer():
    """A failed all-reduce has no time (0 s): it must not count as a step the distance left free."""
    failed = {**row("cross-dc", "baseline", 10**9, 0.0, 0.2, loss=1e-4), "intact": False}
    rows = [row("single-dc", "baseline", 10**9, 0.04, 0.03), failed]
    answer = next(line for line in distance.table(rows, 0.1, 0.5).splitlines() if line.startswith("answer:"))
    assert "at most 10% longer for: none" in answer
    assert "did not complete intact (no figure): baseline 1GB loss 0.0001" in answer
