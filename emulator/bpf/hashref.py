"""The ECMP flow hash in pure Python: the reference for ebpf/include/bp_hash.h.

MurmurHash3 (x86, 32-bit) over 32-bit words in host order, seeded with the switch's node id.
The words per mode: source and destination address, then
  five-tuple: protocol, (source port << 16) | destination port
  qpn:        destination QP
  qpn-psn:    destination QP, PSN
  ev:         UDP source port (the entropy value)
The switch takes next hop ``hash % count`` of the route's next hops.
"""
from __future__ import annotations

import ipaddress

MASK = 0xFFFFFFFF


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & MASK


def _word(h: int, w: int) -> int:
    w = (w * 0xCC9E2D51) & MASK
    w = _rotl(w, 15)
    w = (w * 0x1B873593) & MASK
    h ^= w
    h = _rotl(h, 13)
    return (h * 5 + 0xE6546B64) & MASK


def _final(h: int, nwords: int) -> int:
    h ^= nwords * 4
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & MASK
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & MASK
    h ^= h >> 16
    return h


def words(mode: str, saddr: int, daddr: int, proto: int, sport: int, dport: int, dqpn: int, psn: int) -> list[int]:
    base = [saddr, daddr]
    if mode == "qpn":
        return base + [dqpn & 0xFFFFFF]
    if mode == "qpn-psn":
        return base + [dqpn & 0xFFFFFF, psn & 0xFFFFFF]
    if mode == "ev":
        return base + [sport]
    if mode == "five-tuple":
        return base + [proto, ((sport << 16) | dport) & MASK]
    raise ValueError(f"unknown hash mode {mode!r}")


def flow_hash(mode: str, seed: int, saddr: int | str, daddr: int | str, proto: int, sport: int, dport: int,
              dqpn: int, psn: int) -> int:
    """The switch's hash of one packet; addresses as integers in host order or dotted strings."""
    s = int(ipaddress.IPv4Address(saddr)) if isinstance(saddr, str) else saddr
    d = int(ipaddress.IPv4Address(daddr)) if isinstance(daddr, str) else daddr
    ws = words(mode, s, d, proto, sport, dport, dqpn, psn)
    h = seed & MASK
    for w in ws:
        h = _word(h, w)
    return _final(h, len(ws))


def next_hop(mode: str, seed: int, count: int, **fields) -> int:
    """Which of ``count`` next hops the switch picks."""
    return flow_hash(mode, seed, **fields) % count
