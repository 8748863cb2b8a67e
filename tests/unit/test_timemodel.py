"""The one clock: rates x scale, times x dilation, bytes x scale*dilation, and back for reports."""
import pytest

from emulator.model.timemodel import TimeModel


def test_presets():
    assert TimeModel.of(0.001, "realtime").dilation == 1
    f = TimeModel.of(0.001, "faithful")
    assert f.dilation == pytest.approx(1000) and f.distortion == pytest.approx(1) and f.preset == "faithful"
    assert TimeModel.of(0.001, 10).preset is None


@pytest.mark.parametrize("d", [0, -1, 1001])
def test_refused(d):
    with pytest.raises(ValueError):
        TimeModel(0.001, d)


def test_round_trip_of_every_kind_of_quantity():
    tm = TimeModel.of(0.001, 10)
    assert tm.rate(400e9) == 400_000_000 and tm.real_rate(400e6) == pytest.approx(400e9)
    assert tm.time(0.015) == pytest.approx(0.15) and tm.real_time(0.15) == pytest.approx(0.015)
    assert tm.size(16e6) == 160_000 and tm.real_size(160_000) == pytest.approx(16e6)
    assert tm.distortion == pytest.approx(100)
    assert "d = 10" in tm.line() and "100x" in tm.line()
