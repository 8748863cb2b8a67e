import pytest

from emulator.model import units


@pytest.mark.parametrize("text,bps", [
    ("400Gbps", 400_000_000_000), ("400 Gbps", 400_000_000_000), ("1.6Tbps", 1_600_000_000_000),
    ("100Mbps", 100_000_000), ("25gbit", 25_000_000_000), ("10kbit/s", 10_000), ("9600bps", 9600),
])
def test_rates(text, bps):
    assert units.parse_rate(text) == bps


@pytest.mark.parametrize("text,seconds", [("15ms", 0.015), ("30us", 30e-6), ("2s", 2.0), ("100ns", 1e-7)])
def test_durations(text, seconds):
    assert units.parse_duration(text) == pytest.approx(seconds)


def test_distance_and_fiber_delay():
    assert units.parse_distance("3000km") == 3_000_000
    assert units.fiber_delay(units.parse_distance("3000km")) == pytest.approx(0.015)
    assert units.parse_distance("500m") == 500


@pytest.mark.parametrize("text,nbytes", [("64MB", 64_000_000), ("64MiB", 64 * 2**20), ("5KB", 5000),
                                         ("1GB", 10**9), ("4096B", 4096), ("16kib", 16384)])
def test_sizes(text, nbytes):
    assert units.parse_size(text) == nbytes


@pytest.mark.parametrize("value,p", [("0.01%", 1e-4), (1e-4, 1e-4), ("1e-4", 1e-4), (0, 0.0), ("100%", 1.0)])
def test_probabilities(value, p):
    assert units.parse_probability(value) == pytest.approx(p)


@pytest.mark.parametrize("parse,bad,words", [
    (units.parse_rate, "400", "no unit"),
    (units.parse_rate, 400, "no unit"),
    (units.parse_rate, "400Gbs", "unknown unit"),
    (units.parse_rate, "fast", "expected a rate"),
    (units.parse_rate, None, "expected a rate"),
    (units.parse_rate, True, "expected a rate"),
    (units.parse_duration, "15", "no unit"),
    (units.parse_duration, "15 parsecs", "unknown unit"),
    (units.parse_distance, "3000miles", "unknown unit"),
    (units.parse_size, "64", "no unit"),
    (units.parse_size, [64], "expected a size"),
    (units.parse_probability, "2", r"outside \[0, 1\]"),
    (units.parse_probability, "-1%", r"outside \[0, 1\]"),
    (units.parse_probability, "lots", "expected a probability"),
    (units.parse_probability, True, "expected a probability"),
])
def test_errors_say_what_is_wrong(parse, bad, words):
    with pytest.raises(ValueError, match=words):
        parse(bad)


def test_formatting_round_trips_common_values():
    assert units.format_rate(400_000_000) == "400Mbps"
    assert units.format_rate(units.parse_rate("1.6Tbps")) == "1.6Tbps"
    assert units.format_size(16_000) == "16KB"
    assert units.format_duration(0.015) == "15ms"
    assert units.format_duration(30e-6) == "30us"


@pytest.mark.parametrize("text, n", [("7B", 7 * 10**9), ("70M", 70 * 10**6), ("1.5t", 15 * 10**11), (7e9, 7 * 10**9),
                                     ("405b", 405 * 10**9), ("12", 12)])
def test_counts(text, n):
    assert units.parse_count(text) == n


@pytest.mark.parametrize("text", ["7 bytes", "lots", True, None])
def test_bad_counts(text):
    with pytest.raises(ValueError, match="count"):
        units.parse_count(text)
