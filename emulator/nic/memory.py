"""Memory regions: registered buffers with keys and bounds, as verbs have them.

A remote peer names memory by (R_Key, virtual address, length); every access is checked
against the region's bounds and its access rights before a byte moves, and a failed check is
the NAK "remote access error" with the reason counted. Pure: no I/O.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

LOCAL_WRITE = 1
REMOTE_WRITE = 2
REMOTE_READ = 4


class AccessError(Exception):
    """An access the region does not allow; ``reason`` names the counter."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


@dataclass
class MemoryRegion:
    buffer: bytearray
    va: int  # the address the peer uses for the first byte
    lkey: int
    rkey: int
    access: int

    @property
    def length(self) -> int:
        return len(self.buffer)

    def check(self, va: int, length: int, access: int) -> int:
        """The offset of [va, va+length) in the buffer; raise unless it is inside and allowed."""
        if access & ~self.access:
            raise AccessError("access_denied", f"region {self.rkey:#x} does not grant {access:#x}")
        if length < 0 or va < self.va or va + length > self.va + self.length:
            raise AccessError("out_of_bounds", f"[{va:#x}, +{length}) outside region {self.rkey:#x} "
                                               f"[{self.va:#x}, +{self.length})")
        return va - self.va

    def write(self, va: int, data: bytes | memoryview) -> None:
        off = self.check(va, len(data), REMOTE_WRITE)
        self.buffer[off:off + len(data)] = data

    def read(self, va: int, length: int) -> bytes:
        off = self.check(va, length, REMOTE_READ)
        return bytes(self.buffer[off:off + length])


@dataclass
class ProtectionDomain:
    """Registers regions and finds them by key. Keys are never reused within a domain."""

    regions: dict[int, MemoryRegion] = field(default_factory=dict)
    _keys: itertools.count = field(default_factory=lambda: itertools.count(0x1000))
    _next_va: int = 0x10_0000_0000

    def register(self, buffer: bytearray, access: int = LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ,
                 va: int | None = None, rkey: int | None = None) -> MemoryRegion:
        """A region over ``buffer``; ``va`` and ``rkey`` as the application chooses them (an
        R_Key is 32 bits and names one region), else the domain's next."""
        key = next(self._keys)
        if rkey is None:
            rkey = key ^ 0x5A5A0000
            while rkey in self.regions:
                rkey = next(self._keys) ^ 0x5A5A0000
        elif not 0 <= rkey < 1 << 32 or rkey in self.regions:
            raise ValueError(f"R_Key {rkey:#x}: {'in use' if rkey in self.regions else 'an R_Key has 32 bits'}")
        if va is None:
            va = self._next_va
            self._next_va += max(len(buffer), 1) + 4096  # a gap: an overrun never lands in a neighbour
        elif not 0 <= va < 1 << 64:
            raise ValueError(f"address {va:#x}: a VA has 64 bits")
        mr = MemoryRegion(buffer, va, key, rkey, access)
        self.regions[mr.rkey] = mr
        return mr

    def deregister(self, mr: MemoryRegion) -> None:
        self.regions.pop(mr.rkey, None)

    def remote(self, rkey: int, va: int, length: int, access: int) -> tuple[MemoryRegion, int]:
        mr = self.regions.get(rkey)
        if mr is None:
            raise AccessError("bad_rkey", f"no region with R_Key {rkey:#x}")
        return mr, mr.check(va, length, access)
