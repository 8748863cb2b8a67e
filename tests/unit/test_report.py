"""Figures from a transfer's telemetry, on hand-made series whose answers are known."""
from __future__ import annotations


import matplotlib.image
import pytest

from emulator.stats import jain
from emulator.telemetry import report
from emulator.model.timemodel import TimeModel
from emulator.telemetry.records import PortReading, PortSample


def _result(rates_a, rates_b, period=0.01, depths=(0, 0)):
    """Two senders sampled every ``period`` sending at the given constant rates (bit/s) per interval."""
    def series(rates):
        t, tx, total = [0.0], [0], 0
        for k, r in enumerate(rates):
            total += int(r * period / 8)
            t.append((k + 1) * period)
            tx.append(total)
        return {"t": t, "qps": {"256": {"tx_bytes": tx, "rate_bps": [0] * len(t)}}}

    n = len(rates_a)
    readings = [PortSample(100.0 + k * period, [
        PortReading("leaf:eth0", depths[k % len(depths)], int(k * period * 50e6), k, 0),
        PortReading("leaf:eth1", 0, 0, 0, 0)]).as_dict() for k in range(n + 1)]
    return {"flows": [{"started_s": 0.0, "seconds": n * period}, {"started_s": 0.0, "seconds": n * period}],
            "telemetry": {"t0_monotonic": 100.0, "senders": {"a": series(rates_a), "b": series(rates_b)},
                          "ports": readings, "ports_meta": {"leaf:eth0": {"rate_bps": 400e6, "buffer_bytes": 1000}}}}


def test_fairness_finds_when_the_flows_settled():
    # unfair (300/100) for 5 intervals, then equal
    r = _result([300e6] * 5 + [200e6] * 10, [100e6] * 5 + [200e6] * 10)
    f = report.fairness(r, 0.01)
    assert f["jain"][0] == pytest.approx(jain([3, 1]))
    assert f["fair_after_s"] == pytest.approx(0.05)
    assert f["jain_min"] == pytest.approx(0.8)


def test_fairness_never_settles_when_one_flow_starves():
    f = report.fairness(_result([390e6] * 10, [10e6] * 10), 0.01)
    assert f["fair_after_s"] is None and f["jain_whole"] < 0.6


def test_port_figures_cover_only_ports_that_did_something():
    ports = report.ports(_result([200e6] * 10, [200e6] * 10, depths=(0, 4000, 8000, 4000)))
    assert [p["port"] for p in ports] == ["leaf:eth0"]
    p = ports[0]
    assert p["depth_max"] == 8000 and p["depth_p50"] == 4000
    assert p["ecn_marks"] == 10 and p["buffer_drops"] == 0
    assert p["utilisation"] == pytest.approx(400e6 / 400e6)  # 50 MB/s dequeued on a 400 Mb/s port


def test_reaction_summarises_the_senders_own_summaries():
    def sender(p50, p90, mx):
        return {"nic": {"cnp_reaction_s": {"p50": p50, "p90": p90, "max": mx}}}

    r = {"senders": [sender(3e-3, 9e-3, 20e-3), {"nic": {"cnp_reaction_s": None}}, sender(1e-3, 2e-3, 4e-3),
                     sender(2e-3, 5e-3, 30e-3)]}
    assert report.reaction(r) == {"p50_per_sender": [1e-3, 2e-3, 3e-3], "p50_median": 2e-3,
                                  "p90_max": 9e-3, "max": 30e-3}
    assert report.reaction({"senders": [{"nic": {}}]}) is None


@pytest.mark.parametrize("paused", [False, True])
def test_the_plot_adds_a_pause_panel_when_a_port_paused(tmp_path, paused):
    r = _result([200e6] * 10, [200e6] * 10, depths=(0, 4000))
    r.update(src="a", dst="c", rate_control="none", transport="selective",
             time_model=TimeModel.of(1e-3, 4).as_dict())
    if paused:
        for k, sample in enumerate(r["telemetry"]["ports"]):
            sample["ports"][0]["paused"] = 8 if 3 <= k <= 6 else 0
        r["pfc"] = {"storms": [{"port": "leaf:eth0", "prio": 3, "action": "drop", "paused_at": 100.03,
                                "detected_at": 100.05, "restored_at": 100.09}], "injected": []}
    out = report.plot(r, tmp_path / "r.png")
    height = matplotlib.image.imread(out).shape[0]
    assert height == (11 if paused else 9) * 110  # inches x dpi: a fourth panel with PFC
