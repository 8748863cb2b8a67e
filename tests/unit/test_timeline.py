"""A recording's figures (emulator/telemetry/timeline.py), on hand-made samples whose answers are known."""
from __future__ import annotations

import pytest

from emulator.cli.text import format_recording
from emulator.model.timemodel import TimeModel
from emulator.telemetry import timeline
from emulator.telemetry.records import PortReading, PortSample

TM = TimeModel.of(1 / 1000, 4).as_dict()


def _recording(paused_at: set[int], n: int = 10, period: float = 0.1) -> dict:
    """leaf:eth0 moves 1000 B a sample and is paused at the samples in ``paused_at``;
    leaf:eth1 moves nothing after it sent 3 PAUSEs and dropped 2 lossless packets; leaf:eth2
    does nothing."""
    readings = [PortSample(50.0 + k * period, [
        PortReading("leaf:eth0", 100 * k, 1000 * k, 0, 0, paused=8 if k in paused_at else 0),
        PortReading("leaf:eth1", 0, 0, 0, 0, pauses_sent=3 if k else 0, lossless_drops=2 if k else 0),
        PortReading("leaf:eth2", 0, 0, 0, 0)]).as_dict() for k in range(n + 1)]
    return {"fabric": "t", "time_model": TM, "readings": readings,
            "storms": [{"port": "leaf:eth0", "prio": 3, "action": "drop", "paused_at": 50.2,
                        "detected_at": 50.4, "restored_at": 50.7, "last_pause_at": 50.6}],
            "injected": [{"port": "leaf:eth1", "prio": 3, "started_at": 50.1, "until": None, "ended_at": 50.5,
                          "frames": 10}]}


def test_paused_spans_run_from_the_first_sample_seen_paused_to_the_first_seen_open():
    r = _recording({2, 3, 4, 8, 9, 10})
    assert timeline.paused_spans(r["readings"], "leaf:eth0", 50.0) == [
        pytest.approx((0.2, 0.5)), pytest.approx((0.8, 1.0))]
    assert timeline.paused_spans(r["readings"], "leaf:eth1", 50.0) == []


def test_summary_keeps_the_ports_that_did_something_paused_longest_first():
    rows = timeline.summary(_recording({2, 3, 4}))
    assert [r["port"] for r in rows] == ["leaf:eth0", "leaf:eth1"]
    eth0, eth1 = rows
    assert eth0["moved_bytes"] == 10000 and eth0["rate_bps"] == pytest.approx(10000 * 8 / 1.0)
    assert eth0["paused_share"] == pytest.approx(0.3) and eth0["depth_max"] == 1000
    assert eth1["pauses_sent"] == 3 and eth1["drops"] == 2 and eth1["paused_share"] == 0


def test_the_text_and_the_plot(tmp_path):
    body = _recording({2, 3, 4})
    body["summary"] = timeline.summary(body)
    text = "\n".join(format_recording(body))
    assert "leaf:eth0" in text and "30%" in text and "leaf:eth2" not in text
    assert "storm on leaf:eth0:3 (drop): detected at +100ms, restored at +175ms" in text
    out = timeline.plot(body, tmp_path / "t.png")
    assert out.stat().st_size > 10_000 and out.read_bytes()[:4] == b"\x89PNG"
