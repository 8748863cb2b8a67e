"""One consistent clock for the emulated fabric: rates x scale, times x dilation, bytes x both.

The real fabric (400 Gb/s links, microsecond timers, megabyte buffers) cannot run on a laptop,
so the emulation runs it slower in a way that keeps every ratio a mechanism depends on:

- every rate runs at x ``scale`` (s): 400 Gb/s at s = 1/1000 is 400 Mb/s;
- every time runs at x ``dilation`` (d): a 15 ms fiber at d = 10 delays 150 ms of wall time,
  DCQCN's 50 us timer fires every 50 ms at d = 1000;
- every byte quantity (buffers, ECN and PFC thresholds, DCQCN's byte counter) runs at x s*d, so
  that a buffer holds the same time of traffic and a threshold the same share of it.

Frames do not scale: a 4 KB frame is 4 KB. So the one ratio the emulation distorts is that of a
frame to every byte threshold and of a frame time to every time constant: both by 1/(s*d), the
granularity distortion. At d = 1 (``realtime``) it is 1/s; at d = 1/s (``faithful``) it is 1:
bytes are the real fabric's and every per-packet mechanism has its true granularity, while the
emulator's own costs (a Python NIC's millisecond of loop lag) shrink by d against the fabric.

Pure data and arithmetic; reports speak the real fabric's units (times / d, rates / s,
bytes / (s*d)) through the ``real_*`` methods.
"""
from __future__ import annotations

from dataclasses import dataclass

PRESETS = ("realtime", "faithful")
# d*s may exceed 1 by float rounding of 1/s, never by more.
_EPS = 1e-9


@dataclass(frozen=True)
class TimeModel:
    scale: float  # s: emulated rate / real rate
    dilation: float = 1.0  # d: wall time / real time
    preset: str | None = "realtime"  # how the dilation was given: a preset's name, or None (a number)

    def __post_init__(self) -> None:
        if not 0 < self.scale <= 1:
            raise ValueError(f"scale must be in (0, 1], got {self.scale}")
        if not self.dilation > 0:
            raise ValueError(f"dilation must be positive, got {self.dilation}")
        if self.scale * self.dilation > 1 + _EPS:
            raise ValueError(
                f"dilation {self.dilation:g} at scale {self.scale:g} runs bytes at x{self.byte_scale:g}, more "
                f"than the real fabric's: the largest dilation at this scale is 1/scale = {1 / self.scale:g} "
                "(faithful)")

    @classmethod
    def of(cls, scale: float, dilation: float | str) -> "TimeModel":
        """From a preset's name or a number."""
        if dilation == "realtime":
            return cls(scale, 1.0, "realtime")
        if dilation == "faithful":
            return cls(scale, 1.0 / scale, "faithful")
        if isinstance(dilation, str):
            raise ValueError(f"dilation {dilation!r}: use {' or '.join(PRESETS)}, or a number such as 10")
        return cls(scale, float(dilation), None)

    @property
    def byte_scale(self) -> float:
        """s*d: emulated bytes per real byte for every buffer and threshold."""
        return self.scale * self.dilation

    @property
    def distortion(self) -> float:
        """1/(s*d): how much coarser a frame is against every byte and time constant than in
        the real fabric (1 is faithful)."""
        return 1.0 / self.byte_scale

    # --- real -> emulated ---

    def rate(self, real_bps: float) -> int:
        return round(real_bps * self.scale)

    def size(self, real_bytes: float) -> int:
        return round(real_bytes * self.byte_scale)

    def time(self, real_s: float) -> float:
        return real_s * self.dilation

    # --- emulated -> real, for reports ---

    def real_rate(self, emulated_bps: float) -> float:
        return emulated_bps / self.scale

    def real_size(self, emulated_bytes: float) -> float:
        return emulated_bytes / self.byte_scale

    def real_time(self, wall_s: float) -> float:
        return wall_s / self.dilation

    @property
    def name(self) -> str:
        """``faithful (d = 1000)``, ``realtime (d = 1)`` or ``d = 10``."""
        d = f"d = {self.dilation:g}"
        return f"{self.preset} ({d})" if self.preset else d

    @classmethod
    def from_dict(cls, d: dict) -> "TimeModel":
        """From ``as_dict``'s output (what a report carries)."""
        return cls(d["scale"], d["dilation"], d["preset"])

    def as_dict(self) -> dict:
        return {"scale": self.scale, "dilation": self.dilation, "preset": self.preset,
                "byte_scale": self.byte_scale, "distortion": self.distortion}

    def line(self) -> str:
        """The line every report prints."""
        return (f"time model: scale s = {self.scale:g} (rates), dilation {self.name} (times), bytes x s*d = "
                f"{self.byte_scale:g}; frames are real, so their granularity is {self.distortion:g}x the real "
                "fabric's" + (" (faithful)" if abs(self.distortion - 1) < 1e-6 else ""))
