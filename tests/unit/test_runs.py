"""A scenario run's tables, store, figures and state at a moment (emulator/telemetry/runs.py,
store.py), on a hand-made run whose answers are known: two paths, wan1 cut at 0.3 s and
withdrawn 0.15 s later, restored at 0.7 s, back in ECMP 0.15 s after."""
from __future__ import annotations

import pytest

from emulator.errors import UsageError
from emulator.model.timemodel import TimeModel
from emulator.telemetry import runs, store

TM = TimeModel.of(1e-3, 1)
T0 = 1000.0
PERIOD = 0.05


def _run(paths: bool = False):
    """With ``paths``, the samples carry the borders' recorded ECMP shares (adaptive routing
    weighting wan0 3:1 from 0.1 s to the cut) and the fibers' own packet counts."""
    readings = []
    fiber = dict.fromkeys(("east-border0:eth2", "east-border0:eth3"), 0)
    moved = {"east-border0:eth2": 0, "east-border0:eth3": 0}
    dropped = dict.fromkeys(moved, 0)
    for k in range(21):
        t = k * PERIOD
        cut = 0.3 <= t < 0.45  # sent into the dead path until it was withdrawn (lost there)
        withdrawn = 0.45 <= t < 0.85
        moved["east-border0:eth2"] += 0 if k == 0 else (100_000 if withdrawn else 50_000)
        moved["east-border0:eth3"] += 0 if k == 0 or withdrawn or cut else 50_000
        dropped["east-border0:eth3"] += 12 if 7 <= k <= 9 else 0  # sent into the dead path until withdrawn
        ports = [{"port": p, "depth": 4000 if (p.endswith("eth3") and cut) else 0, "deq_bytes": n, "ecn_marks": 0,
                  "drops": 0, "paused": 8 if (p.endswith("eth2") and k == 10) else 0, "down_drops": dropped[p]}
                 for p, n in moved.items()]
        readings.append({"t": T0 + t, "ports": ports})
        if paths:
            weighted = 0.1 <= t < 0.3
            share = {"east-border0:eth2": 1.0 if 0.45 <= t < 0.85 else 0.75 if weighted else 0.5,
                     "east-border0:eth3": 0.0 if 0.45 <= t < 0.85 else 0.25 if weighted else 0.5}
            for port in fiber:
                fiber[port] += 0 if k == 0 or (port.endswith("eth3") and 0.35 <= t < 0.75) else 40
            # The controller reads the fibers every other sample here (None between).
            readings[-1]["paths"] = [{"port": port, "path": int(port.endswith("eth3")), "share": share[port],
                                      "fiber_packets": None if k % 2 else fiber[port]} for port in fiber]
    senders = {"east-host0": {"t": [k * PERIOD for k in range(21)], "qps": {"256": {
        "rate_bps": [1e8] * 21, "tx_bytes": [k * 12_500 for k in range(21)],
        "retransmits": [0] * 7 + [5] * 14, "cnps_received": [0] * 21}}}}
    applied = [{"kind": "fiber-cut", "target": "wan1", "at_s": 0.3, "options": {}, "applied_at": T0 + 0.301,
                "fault_id": 1},
               {"kind": "restore", "target": "wan1", "at_s": 0.7, "options": {}, "applied_at": T0 + 0.7,
                "fault_id": None}]
    faults = [{"id": 1, "ports": ["east-border0:eth3", "west-border0:eth3"], "took_effect_at": T0 + 0.3015,
               "noticed_at": T0 + 0.4515, "converged_at": T0 + 0.4516, "restored_at": T0 + 0.7,
               "reconverged_at": T0 + 0.85}]
    rows = runs.tables(TM, T0, readings, senders, {"east-border0:eth2": 0, "east-border0:eth3": 1}, applied, faults)
    manifest = {"time_model": TM.as_dict(), "scenario": {"name": "t", "description": "cut"},
                "columns": {k: list(v) for k, v in runs.COLUMNS.items()},
                "result": {"intact": True, "complete": True, "seconds": 1.0, "goodput_bps": 1e8, "retransmits": 5,
                           "timeouts": 0}}
    return manifest, rows


def test_the_store_round_trips_and_refuses_what_is_not_a_run(tmp_path):
    manifest, rows = _run()
    store.write(tmp_path / "r", manifest, rows)
    got_manifest, got = store.read(tmp_path / "r")
    assert got == rows and got_manifest["rows"]["ports"] == 42 and got_manifest["format"] == store.FORMAT_VERSION
    import pyarrow.parquet as pq

    assert pq.read_table(tmp_path / "r" / "paths.parquet").column_names == list(runs.COLUMNS["paths"])
    with pytest.raises(UsageError, match="not a run directory"):
        store.read(tmp_path)
    (tmp_path / "r" / "nics.parquet").unlink()
    with pytest.raises(UsageError, match="nics.parquet is missing"):
        store.read(tmp_path / "r")


def test_an_empty_table_keeps_its_columns(tmp_path):
    manifest, rows = _run()
    rows["events"] = []
    store.write(tmp_path / "r", manifest, rows)
    import pyarrow.parquet as pq

    assert pq.read_table(tmp_path / "r" / "events.parquet").column_names == list(runs.COLUMNS["events"])


def test_the_figures_of_a_cut():
    manifest, rows = _run()
    f = runs.figures(manifest, rows)["events"]
    cut, restore = f
    assert cut["detection_s"] == pytest.approx(0.150) and cut["time_lost_s"] == pytest.approx(0.1501)
    assert cut["applied_late_s"] == pytest.approx(0.001) and cut["back_in_ecmp_after_s"] == pytest.approx(0.15)
    # wan1's border last dropped what was sent into it in the sample at 0.45 s, 0.1485 s after the cut
    assert cut["loss_window_s"] == pytest.approx(0.45 - 0.3015) and cut["lost_packets"] == 3 * 12
    # ... within the interval after the sample before it: the figure's resolution
    assert cut["loss_window_step_s"] == pytest.approx(PERIOD)
    assert restore["kind"] == "restore" and "detection_s" not in restore


@pytest.mark.parametrize("at, wan1, share0", [(0.2, (True, True), 0.5), (0.35, (False, True), 0.5),
                                              (0.6, (False, False), 1.0), (0.75, (True, False), 1.0),
                                              (0.95, (True, True), 0.5)])
def test_the_state_at_a_moment(at, wan1, share0):
    manifest, rows = _run()
    s = runs.state_at(manifest, rows, at)
    p0, p1 = s["paths"]
    assert (p1["up"], p1["in_ecmp"]) == wan1 and p0["ecmp_share"] == share0
    assert s["sample_t_real_s"] <= at


def test_the_state_reads_rates_and_queues_in_real_units():
    manifest, rows = _run()
    s = runs.state_at(manifest, rows, 0.6)
    p0, p1 = s["paths"]
    assert p0["rate_bps"] == pytest.approx(100_000 * 8 / PERIOD / 1e-3) and p1["rate_bps"] == 0
    s = runs.state_at(manifest, rows, 0.35)
    assert s["queues"] == [{"port": "east-border0:eth3", "depth_bytes": pytest.approx(4000 / 1e-3),
                            "paused_priorities": []}]
    assert runs.state_at(manifest, rows, 0.5)["queues"][0]["paused_priorities"] == [3]


def test_the_plot(tmp_path):
    manifest, rows = _run()
    out = runs.plot(manifest, rows, tmp_path / "t.png")
    assert out.read_bytes()[:4] == b"\x89PNG"


def test_the_nics_series_is_put_on_the_timelines_clock():
    # The transfer's own clock starts before its workers come up; the timeline's at the data.
    readings, senders = [{"t": T0, "ports": []}], {"h": {"t": [0.5, 0.6], "qps": {"1": {"retransmits": [0, 3]}}}}
    rows = runs.tables(TM, T0, readings, senders, {}, [], [], senders_t0=T0 - 0.45)
    assert [r["t_s"] for r in rows["nics"]] == pytest.approx([0.05, 0.15])
    assert [r["t_s"] for r in runs.tables(TM, T0, readings, senders, {}, [], [])["nics"]] == [0.5, 0.6]


def test_recorded_shares_and_the_fibers_counts():
    manifest, rows = _run(paths=True)
    s = runs.state_at(manifest, rows, 0.2)  # adaptive routing's weights, not equal shares
    assert [p["ecmp_share"] for p in s["paths"]] == [0.75, 0.25] and all(p["in_ecmp"] for p in s["paths"])
    s = runs.state_at(manifest, rows, 0.6)
    assert [p["ecmp_share"] for p in s["paths"]] == [1.0, 0.0] and not s["paths"][1]["in_ecmp"]
    # A sample read before the withdrawal converged holds the old shares; asked for a moment
    # after it, the state gives the groups as they were written then.
    for r in rows["paths"]:
        if r["t_s"] == pytest.approx(0.45):
            r["share"] = 0.5
    s = runs.state_at(manifest, rows, 0.46)
    assert [p["ecmp_share"] for p in s["paths"]] == [1.0, 0.0] and not s["paths"][1]["in_ecmp"]
    # The fiber carried nothing from the first sample after convergence to the last before
    # restore (0.5 s to 0.65 s); recorded without the fibers' counts, the figure is unknown, not 0.
    assert runs.figures(manifest, rows)["events"][0]["fiber_packets_while_withdrawn"] == 0
    assert runs.figures(*_run())["events"][0]["fiber_packets_while_withdrawn"] is None
    # A fiber that kept carrying is seen: the counts grow in the window.
    for r in rows["paths"]:
        if r["port"] == "east-border0:eth3" and 0.6 <= r["t_s"] and r["fiber_packets"] is not None:
            r["fiber_packets"] += 7
    assert runs.figures(manifest, rows)["events"][0]["fiber_packets_while_withdrawn"] == 7


def test_the_run_and_state_texts():
    from emulator.cli.text import format_run, format_state

    manifest, rows = _run()
    text = "\n".join(format_run({"time_model": manifest["time_model"], **runs.figures(manifest, rows)}))
    assert "fiber-cut" in text and "150ms" in text and "148.5ms" in text and "intact" in text
    state = "\n".join(format_state(runs.state_at(manifest, rows, 0.6)))
    assert "wan1   DOWN  withdrawn  share 0.000" in state and "wan0   up    in ECMP    share 1.000" in state
