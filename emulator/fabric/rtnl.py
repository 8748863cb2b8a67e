"""The rtnetlink messages a fabric's build sends and reads by the thousand, packed with struct.

pyroute2 encodes a route in about 0.2 ms and decodes one in more: at a thousand nodes a fabric
holds tens of thousands of routes, and its encoder alone would be the build. So the build's
routes go to the kernel as batches of prebuilt messages on one socket per namespace, every one
acknowledged and every error raised, and the table is read back in one dump parsed here. The
rest of the build (links, addresses, qdiscs) stays on pyroute2: it is a few requests a port.
"""
from __future__ import annotations

import ipaddress
import os
import socket
import struct
from dataclasses import dataclass
from typing import Iterable, Sequence

# linux/netlink.h and linux/rtnetlink.h
NLMSG_ERROR = 2
NLMSG_DONE = 3
RTM_NEWROUTE = 24
RTM_GETROUTE = 26
NLM_F_REQUEST = 0x1
NLM_F_MULTI = 0x2
NLM_F_ACK = 0x4
NLM_F_DUMP = 0x300
NLM_F_EXCL = 0x200
NLM_F_CREATE = 0x400
RTA_DST = 1
RTA_OIF = 4
RTA_GATEWAY = 5
RTA_MULTIPATH = 9
RTA_TABLE = 15
RTPROT_STATIC = 4  # what `ip route add` and pyroute2 give a route added by hand
RTN_UNICAST = 1
RT_SCOPE_UNIVERSE = 0
RT_SCOPE_LINK = 253  # the destination is on the port's own link: no gateway
MAIN_TABLE = 254

_NLMSG = struct.Struct("=IHHII")  # length, type, flags, sequence, port id
_RTMSG = struct.Struct("=BBBBBBBBI")  # family, dst_len, src_len, tos, table, protocol, scope, type, flags
_RTA = struct.Struct("=HH")  # length, type
_RTNH = struct.Struct("=HBBi")  # length, flags, hops, ifindex
_ERR = struct.Struct("=i")
# Messages per send: their acknowledgements (36 bytes each, the whole request on an error)
# must fit the socket's receive buffer before they are read.
BATCH = 512


class RtnlError(Exception):
    """The kernel refused a request (errno), or answered with something not asked for."""

    def __init__(self, message: str, errno: int = 0) -> None:
        super().__init__(message)
        self.errno = errno


@dataclass(frozen=True)
class RouteAdd:
    """One route to add in the main table: ``hops`` are (gateway or "" when the destination is
    on the port's link, the port's ifindex)."""

    dst: ipaddress.IPv4Network
    hops: tuple[tuple[str, int], ...]


def _attr(kind: int, payload: bytes) -> bytes:
    length = _RTA.size + len(payload)
    return _RTA.pack(length, kind) + payload + b"\0" * (-length % 4)


def route_message(route: RouteAdd, seq: int) -> bytes:
    """RTM_NEWROUTE with NLM_F_CREATE | NLM_F_EXCL: a route already there is an error (EEXIST)."""
    if not route.hops:
        raise ValueError(f"route {route.dst} has no next hop")
    single = len(route.hops) == 1
    scope = RT_SCOPE_LINK if single and not route.hops[0][0] else RT_SCOPE_UNIVERSE
    body = _RTMSG.pack(socket.AF_INET, route.dst.prefixlen, 0, 0, MAIN_TABLE, RTPROT_STATIC, scope,
                       RTN_UNICAST, 0)
    attrs = [_attr(RTA_DST, route.dst.network_address.packed), _attr(RTA_TABLE, struct.pack("=I", MAIN_TABLE))]
    if single:
        gw, oif = route.hops[0]
        attrs.append(_attr(RTA_OIF, struct.pack("=i", oif)))
        if gw:
            attrs.append(_attr(RTA_GATEWAY, socket.inet_aton(gw)))
    else:
        hops = b""
        for gw, oif in route.hops:
            gateway = _attr(RTA_GATEWAY, socket.inet_aton(gw)) if gw else b""
            hops += _RTNH.pack(_RTNH.size + len(gateway), 0, 0, oif) + gateway
        attrs.append(_attr(RTA_MULTIPATH, hops))
    payload = body + b"".join(attrs)
    return _NLMSG.pack(_NLMSG.size + len(payload), RTM_NEWROUTE, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
                       seq, 0) + payload


def socket_here() -> socket.socket:
    """A bare rtnetlink socket in the namespace the calling thread is in."""
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)  # NETLINK_ROUTE
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    sock.bind((0, 0))
    return sock


def _messages(data: bytes) -> Iterable[tuple[int, int, int, memoryview]]:
    """(type, flags, sequence, payload) of each netlink message in one datagram."""
    view = memoryview(data)
    off = 0
    while off + _NLMSG.size <= len(view):
        length, kind, flags, seq, _ = _NLMSG.unpack_from(view, off)
        if length < _NLMSG.size or off + length > len(view):
            raise RtnlError(f"a netlink message of length {length} at offset {off} overruns its datagram")
        yield kind, flags, seq, view[off + _NLMSG.size:off + length]
        off += (length + 3) & ~3


def add_routes(sock: socket.socket, routes: Sequence[RouteAdd]) -> None:
    """Add ``routes``, BATCH to a send, and read every acknowledgement; raise on the first the
    kernel refused, naming the route."""
    seq0 = 1
    for start in range(0, len(routes), BATCH):
        chunk = routes[start:start + BATCH]
        sock.send(b"".join(route_message(r, seq0 + i) for i, r in enumerate(chunk)))
        waiting = set(range(seq0, seq0 + len(chunk)))
        while waiting:
            for kind, _, seq, payload in _messages(sock.recv(1 << 20)):
                if kind != NLMSG_ERROR or seq not in waiting:
                    raise RtnlError(f"netlink answered a route add with message type {kind} (sequence {seq})")
                error = -_ERR.unpack_from(payload)[0]
                if error:
                    route = chunk[seq - seq0]
                    raise RtnlError(f"adding route {route.dst} via {list(route.hops)} failed: "
                                    f"{os.strerror(error)}", error)
                waiting.discard(seq)
        seq0 += len(chunk)


def _attrs(data: memoryview) -> dict[int, memoryview]:
    out = {}
    off = 0
    while off + _RTA.size <= len(data):
        length, kind = _RTA.unpack_from(data, off)
        if length < _RTA.size:
            break
        out[kind & 0x3FFF] = data[off + _RTA.size:off + length]
        off += (length + 3) & ~3
    return out


def _ip(raw: memoryview | None) -> str:
    return socket.inet_ntoa(bytes(raw)) if raw is not None else ""


def main_routes(sock: socket.socket) -> dict[ipaddress.IPv4Network, set[tuple[str, int]]]:
    """The main IPv4 table in one dump: destination -> {(gateway or "", oif)}."""
    request = _NLMSG.pack(_NLMSG.size + _RTMSG.size, RTM_GETROUTE, NLM_F_REQUEST | NLM_F_DUMP, 1, 0)
    sock.send(request + _RTMSG.pack(socket.AF_INET, 0, 0, 0, 0, 0, 0, 0, 0))
    out: dict[ipaddress.IPv4Network, set[tuple[str, int]]] = {}
    while True:
        for kind, _, seq, payload in _messages(sock.recv(1 << 20)):
            if kind == NLMSG_DONE:
                return out
            if kind == NLMSG_ERROR:
                error = -_ERR.unpack_from(payload)[0]
                raise RtnlError(f"dumping the routes failed: {os.strerror(error)}", error)
            if kind != RTM_NEWROUTE:
                continue
            family, dst_len, _, _, table, _, _, _, _ = _RTMSG.unpack_from(payload)
            attrs = _attrs(payload[_RTMSG.size:])
            if RTA_TABLE in attrs:
                table = struct.unpack_from("=I", attrs[RTA_TABLE])[0]
            if family != socket.AF_INET or table != MAIN_TABLE:
                continue
            dst = ipaddress.IPv4Network((_ip(attrs.get(RTA_DST)) or "0.0.0.0", dst_len))
            hops = out.setdefault(dst, set())
            if RTA_MULTIPATH in attrs:
                mp, off = attrs[RTA_MULTIPATH], 0
                while off + _RTNH.size <= len(mp):
                    length, _, _, oif = _RTNH.unpack_from(mp, off)
                    if length < _RTNH.size:
                        break
                    hops.add((_ip(_attrs(mp[off + _RTNH.size:off + length]).get(RTA_GATEWAY)), oif))
                    off += (length + 3) & ~3
            else:
                oif = struct.unpack_from("=i", attrs[RTA_OIF])[0] if RTA_OIF in attrs else 0
                hops.add((_ip(attrs.get(RTA_GATEWAY)), oif))
