"""Quantities written as humans write them: ``400Gbps``, ``15ms``, ``3000km``, ``64MB``, ``0.01%``.

Each parser returns base units (bits per second, seconds, metres, bytes, a probability) and
raises ``ValueError`` with a sentence that says what was expected; the spec loader adds the file
and key path. Bare numbers are refused for dimensioned quantities: ``400`` could be anything.
Sizes follow SI (``MB`` = 10**6 bytes) and IEC (``MiB`` = 2**20 bytes) exactly as written.
"""
from __future__ import annotations

import re

_NUMBER = r"(?P<num>[0-9]+(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?)"
_QUANTITY = re.compile(_NUMBER + r"\s*(?P<unit>[A-Za-z%/]*)$")

_RATE_UNITS = {
    "bps": 1, "kbps": 1e3, "mbps": 1e6, "gbps": 1e9, "tbps": 1e12,
    "bit/s": 1, "kbit/s": 1e3, "mbit/s": 1e6, "gbit/s": 1e9, "tbit/s": 1e12,
    "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12,
}
_TIME_UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0}
_DISTANCE_UNITS = {"m": 1.0, "km": 1e3}
_SIZE_UNITS = {
    "b": 1, "byte": 1, "bytes": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}

# Light in fiber covers a kilometre in about 5 us (refractive index ~1.47).
FIBER_SECONDS_PER_METRE = 5e-9


def _split(text: object, kind: str, units: dict, example: str) -> tuple[float, float]:
    if isinstance(text, bool) or not isinstance(text, (str, int, float)):
        raise ValueError(f"expected a {kind} such as {example!r}, got {type(text).__name__}")
    match = _QUANTITY.match(str(text).strip())
    if not match:
        raise ValueError(f"expected a {kind} such as {example!r}, got {text!r}")
    unit = match.group("unit")
    if not unit:
        raise ValueError(f"{kind} {text!r} has no unit; write it like {example!r}")
    factor = units.get(unit.lower())
    if factor is None:
        known = ", ".join(sorted(units))
        raise ValueError(f"unknown unit {unit!r} in {text!r}; known: {known}")
    return float(match.group("num")), factor


def parse_rate(text: object) -> int:
    """``400Gbps`` -> 400_000_000_000 (bits per second)."""
    num, factor = _split(text, "rate", _RATE_UNITS, "400Gbps")
    return round(num * factor)


def parse_duration(text: object) -> float:
    """``15ms`` -> 0.015 (seconds)."""
    num, factor = _split(text, "duration", _TIME_UNITS, "15ms")
    return num * factor


def parse_distance(text: object) -> float:
    """``3000km`` -> 3_000_000.0 (metres)."""
    num, factor = _split(text, "distance", _DISTANCE_UNITS, "3000km")
    return num * factor


def parse_size(text: object) -> int:
    """``64MB`` -> 64_000_000, ``64MiB`` -> 67_108_864 (bytes)."""
    num, factor = _split(text, "size", _SIZE_UNITS, "64MB")
    return round(num * factor)


_COUNT_UNITS = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9, "t": 10**12}


def parse_count(text: object) -> int:
    """``7B`` or ``7e9`` -> 7_000_000_000 (a count, such as a model's parameters: k, M, B or G, T)."""
    if isinstance(text, bool) or not isinstance(text, (str, int, float)):
        raise ValueError(f"expected a count such as '7B' or 7e9, got {type(text).__name__}")
    match = _QUANTITY.match(str(text).strip())
    factor = _COUNT_UNITS.get(match.group("unit").lower()) if match else None
    if factor is None:
        raise ValueError(f"expected a count such as '7B', '70M' or 7e9, got {text!r}")
    return round(float(match.group("num")) * factor)


def parse_probability(text: object) -> float:
    """``0.01%`` or ``1e-4`` -> 0.0001; must lie in [0, 1]."""
    if isinstance(text, bool):
        raise ValueError(f"expected a probability such as '0.01%' or 1e-4, got {text!r}")
    if isinstance(text, (int, float)):
        value = float(text)
    elif isinstance(text, str):
        s = text.strip()
        try:
            value = float(s[:-1]) / 100.0 if s.endswith("%") else float(s)
        except ValueError:
            raise ValueError(f"expected a probability such as '0.01%' or 1e-4, got {text!r}") from None
    else:
        raise ValueError(f"expected a probability such as '0.01%' or 1e-4, got {type(text).__name__}")
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"probability {text!r} is outside [0, 1]")
    return value


def fiber_delay(distance_m: float) -> float:
    """One-way propagation delay in seconds over ``distance_m`` of fiber."""
    return distance_m * FIBER_SECONDS_PER_METRE


def format_rate(bps: float) -> str:
    for unit, factor in (("Tbps", 1e12), ("Gbps", 1e9), ("Mbps", 1e6), ("kbps", 1e3)):
        if bps >= factor:
            return f"{bps / factor:g}{unit}"
    return f"{bps:g}bps"


def format_size(nbytes: float) -> str:
    for unit, factor in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if nbytes >= factor:
            return f"{nbytes / factor:.4g}{unit}"
    return f"{nbytes:g}B"


def format_duration(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.4g}s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.4g}ms"
    return f"{seconds * 1e6:.4g}us"
