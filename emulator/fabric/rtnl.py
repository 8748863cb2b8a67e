"""The rtnetlink messages a fabric's build sends and reads by the thousand, packed with struct.

pyroute2 encodes a route in about 0.2 ms and decodes one in more: at a thousand nodes a fabric
holds tens of thousands of routes, and its encoder alone would be the build. So the build's
routes go to the kernel as batches of prebuilt messages on one socket per namespace, every one
acknowledged and every error raised, and the table is read back in one dump parsed here. Its
qdiscs, classes and filters are encoded by pyroute2 once per distinct request (tc_message: the
ports of a tier ask the same of the kernel but for their ifindex) and batched the same way.
"""
from __future__ import annotations

import ipaddress
import os
import socket
import struct
import functools
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from pyroute2.netlink.rtnl.tcmsg import plugins as tc_plugins, tcmsg

# linux/netlink.h and linux/rtnetlink.h
NLMSG_ERROR = 2
NLMSG_DONE = 3
RTM_NEWLINK = 16
RTM_SETLINK = 19
RTM_NEWADDR = 20
RTM_NEWROUTE = 24
RTM_GETROUTE = 26
RTM_NEWQDISC = 36
RTM_NEWTCLASS = 40
RTM_NEWTFILTER = 44
RTM_GETTFILTER = 46
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
TCA_KIND = 1
TCA_OPTIONS = 2
TCA_BPF_NAME = 7
TCA_BPF_ID = 11
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
_IFINFO = struct.Struct("=BxHiII")  # family, type, index, flags, change
_IFADDR = struct.Struct("=BBBBI")  # family, prefix length, flags, scope, index
IFA_ADDRESS = 1
IFA_LOCAL = 2
IFF_UP = 0x1
_TCMSG = struct.Struct("=BxxxiIII")  # family, ifindex, handle, parent, info
_TC_IFINDEX = _NLMSG.size + 4  # where a tcmsg holds its ifindex
# tc commands as IPRoute.tc names them: (message type, flags)
TC_COMMANDS = {"add": (RTM_NEWQDISC, NLM_F_CREATE | NLM_F_EXCL), "add-class": (RTM_NEWTCLASS, NLM_F_CREATE | NLM_F_EXCL),
               "add-filter": (RTM_NEWTFILTER, NLM_F_CREATE | NLM_F_EXCL)}
TC_H_ROOT = 0xFFFFFFFF
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


def link_up_message(ifindex: int) -> bytes:
    """RTM_NEWLINK setting IFF_UP on ``ifindex`` (`ip link set dev X up`)."""
    payload = _IFINFO.pack(socket.AF_UNSPEC, 0, ifindex, IFF_UP, IFF_UP)
    return _NLMSG.pack(_NLMSG.size + len(payload), RTM_NEWLINK, NLM_F_REQUEST | NLM_F_ACK, 0, 0) + payload


def addr_message(ifindex: int, address: ipaddress.IPv4Interface) -> bytes:
    """RTM_NEWADDR of ``address`` on ``ifindex`` (`ip addr add A/L dev X`); one already there is
    an error (EEXIST)."""
    packed = address.ip.packed
    payload = (_IFADDR.pack(socket.AF_INET, address.network.prefixlen, 0, 0, ifindex)
               + _attr(IFA_ADDRESS, packed) + _attr(IFA_LOCAL, packed))
    return _NLMSG.pack(_NLMSG.size + len(payload), RTM_NEWADDR, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
                       0, 0) + payload


def tc_message(command: str, kind: str, ifindex: int, handle: int = 0, **kwargs: Any) -> bytes:
    """The message IPRoute.tc(command, kind, ifindex, handle, **kwargs) sends, for the commands
    of TC_COMMANDS. Encoded once per distinct request: only the ifindex differs between ports."""
    frozen = tuple(sorted((k, _freeze(v)) for k, v in kwargs.items()))
    template = _tc_template(command, kind, handle, frozen)
    return template[:_TC_IFINDEX] + struct.pack("=i", ifindex) + template[_TC_IFINDEX + 4:]


def _freeze(value: Any) -> Any:
    if isinstance(value, dict):
        return ("__dict__", tuple(sorted((k, _freeze(v)) for k, v in value.items())))
    if isinstance(value, list):
        return ("__list__", tuple(_freeze(v) for v in value))
    return value


def _thaw(value: Any) -> Any:
    if isinstance(value, tuple) and value and value[0] == "__dict__":
        return {k: _thaw(v) for k, v in value[1]}
    if isinstance(value, tuple) and value and value[0] == "__list__":
        return [_thaw(v) for v in value[1]]
    return value


@functools.lru_cache(maxsize=1024)
def _tc_template(command: str, kind: str, handle: int, frozen: tuple) -> bytes:
    msg_type, create = TC_COMMANDS[command]
    kwargs = {k: _thaw(v) for k, v in frozen}
    msg = tcmsg()
    msg["index"], msg["handle"] = 0, handle
    p = tc_plugins[kind]
    msg["parent"] = kwargs.pop("parent", getattr(p, "parent", 0))
    if hasattr(p, "fix_msg"):
        p.fix_msg(msg, kwargs)
    opts = None
    if kwargs:
        opts = p.get_class_parameters(kwargs) if msg_type == RTM_NEWTCLASS else p.get_parameters(kwargs)
    msg["attrs"] = [["TCA_KIND", kind]] + ([["TCA_OPTIONS", opts]] if opts is not None else [])
    msg["header"]["type"] = msg_type
    msg["header"]["flags"] = NLM_F_REQUEST | NLM_F_ACK | create
    msg.encode()
    return bytes(msg.data)


def request_all(sock: socket.socket, messages: Sequence[bytes], what: Sequence[str]) -> None:
    """Send ``messages`` (each asking for an acknowledgement), BATCH to a send, and read every
    acknowledgement; raise on the first the kernel refused, with its ``what``."""
    seq0 = 1
    for start in range(0, len(messages), BATCH):
        chunk = messages[start:start + BATCH]
        sock.send(b"".join(m[:8] + struct.pack("=I", seq0 + i) + m[12:] for i, m in enumerate(chunk)))
        waiting = set(range(seq0, seq0 + len(chunk)))
        while waiting:
            for kind, _, seq, payload in _messages(sock.recv(1 << 20)):
                if kind != NLMSG_ERROR or seq not in waiting:
                    raise RtnlError(f"netlink answered {what[start + seq - seq0] if seq in waiting else 'a request'} "
                                    f"with message type {kind} (sequence {seq})")
                error = -_ERR.unpack_from(payload)[0]
                if error:
                    raise RtnlError(f"{what[start + seq - seq0]} failed: {os.strerror(error)}", error)
                waiting.discard(seq)
        seq0 += len(chunk)


def _dump(sock: socket.socket, request: bytes, answer: int, what: str) -> Iterable[memoryview]:
    """Send a dump request and yield the payload of each ``answer`` message until the dump ends."""
    sock.send(request)
    while True:
        for kind, _, _, payload in _messages(sock.recv(1 << 20)):
            if kind == NLMSG_DONE:
                return
            if kind == NLMSG_ERROR:
                error = -_ERR.unpack_from(payload)[0]
                raise RtnlError(f"dumping {what} failed: {os.strerror(error)}", error)
            if kind == answer:
                yield payload


def bpf_filters(sock: socket.socket, ifindex: int, parent: int) -> list[tuple[str, int]]:
    """(program name, program id) of each bpf filter on ``ifindex`` under ``parent``, one dump."""
    request = (_NLMSG.pack(_NLMSG.size + _TCMSG.size, RTM_GETTFILTER, NLM_F_REQUEST | NLM_F_DUMP, 1, 0)
               + _TCMSG.pack(socket.AF_UNSPEC, ifindex, 0, parent, 0))
    out = []
    for payload in _dump(sock, request, RTM_NEWTFILTER, f"the filters of ifindex {ifindex}"):
        attrs = _attrs(payload[_TCMSG.size:])
        if bytes(attrs.get(TCA_KIND, b"")).rstrip(b"\0") != b"bpf" or TCA_OPTIONS not in attrs:
            continue
        opts = _attrs(attrs[TCA_OPTIONS])
        name = bytes(opts.get(TCA_BPF_NAME, b"")).rstrip(b"\0").decode()
        prog = struct.unpack_from("=I", opts[TCA_BPF_ID])[0] if TCA_BPF_ID in opts else 0
        out.append((name, prog))
    return out


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
    request_all(sock, [route_message(r, 0) for r in routes],
                [f"adding route {r.dst} via {list(r.hops)}" for r in routes])


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
    request = (_NLMSG.pack(_NLMSG.size + _RTMSG.size, RTM_GETROUTE, NLM_F_REQUEST | NLM_F_DUMP, 1, 0)
               + _RTMSG.pack(socket.AF_INET, 0, 0, 0, 0, 0, 0, 0, 0))
    out: dict[ipaddress.IPv4Network, set[tuple[str, int]]] = {}
    for payload in _dump(sock, request, RTM_NEWROUTE, "the routes"):
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
    return out
