"""The build's hand-packed route messages against pyroute2's encoder, and the dump parser and
acknowledgement reader against replies as the kernel sends them (over a socket pair)."""
from __future__ import annotations

import errno
import ipaddress
import socket
import struct

import pytest
from pyroute2 import IPBatch
from pyroute2.netlink.rtnl.rtmsg import rtmsg

from emulator.fabric import rtnl

NET = ipaddress.IPv4Network

CASES = [
    (rtnl.RouteAdd(NET("198.19.0.2/31"), (("198.19.0.1", 5),)),
     {"oif": 5, "gateway": "198.19.0.1"}),
    (rtnl.RouteAdd(NET("198.18.0.7/32"), (("", 9),)),
     {"oif": 9, "scope": 253}),
    (rtnl.RouteAdd(NET("198.18.4.0/24"), (("198.19.0.1", 5), ("198.19.0.3", 6))),
     {"multipath": [{"gateway": "198.19.0.1", "oif": 5}, {"gateway": "198.19.0.3", "oif": 6}]}),
]


@pytest.mark.parametrize("route,kwargs", CASES, ids=["gateway", "on-link", "multipath"])
def test_a_route_message_is_what_pyroute2_would_send(route, kwargs):
    batch = IPBatch()
    batch.route("add", dst=str(route.dst.network_address), dst_len=route.dst.prefixlen, table=254, **kwargs)
    theirs = bytes(batch.batch)
    ours = rtnl.route_message(route, seq=struct.unpack_from("=I", theirs, 8)[0])
    # Everything but the port id (pyroute2 fills in its own) is the same, byte for byte.
    assert ours[:12] == theirs[:12] and ours[16:] == theirs[16:]


def _reply(kind: int, seq: int, payload: bytes, flags: int = 0) -> bytes:
    return struct.pack("=IHHII", 16 + len(payload), kind, flags, seq, 0) + payload


def _route_reply(dst: str, dst_len: int, table: int, **kwargs) -> bytes:
    msg = rtmsg()
    msg["family"], msg["dst_len"], msg["table"] = socket.AF_INET, dst_len, min(table, 255)
    msg["attrs"] = [("RTA_TABLE", table)] + ([("RTA_DST", dst)] if dst_len else [])
    for key, value in kwargs.items():
        msg["attrs"].append((key, value))
    msg.encode()
    return _reply(rtnl.RTM_NEWROUTE, 1, bytes(msg.data)[16:], rtnl.NLM_F_MULTI)


def test_the_dump_gives_the_main_tables_routes_and_their_next_hops():
    ours, kernel = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    with ours, kernel:
        kernel.send(_route_reply("198.18.0.0", 24, 254, RTA_OIF=7, RTA_GATEWAY="198.19.0.1")
                    + _route_reply("127.0.0.0", 8, 255, RTA_OIF=1)  # the local table: not ours
                    + _route_reply("198.18.0.7", 32, 254, RTA_OIF=9))
        mp = rtmsg()
        mp["family"], mp["dst_len"], mp["table"] = socket.AF_INET, 24, 254
        mp["attrs"] = [("RTA_TABLE", 254), ("RTA_DST", "198.18.4.0"),
                       ("RTA_MULTIPATH", [{"oif": 5, "attrs": [["RTA_GATEWAY", "198.19.0.1"]]},
                                          {"oif": 6, "attrs": [["RTA_GATEWAY", "198.19.0.3"]]}])]
        mp.encode()
        kernel.send(_reply(rtnl.RTM_NEWROUTE, 1, bytes(mp.data)[16:], rtnl.NLM_F_MULTI)
                    + _reply(rtnl.NLMSG_DONE, 1, struct.pack("=i", 0)))
        got = rtnl.main_routes(ours)
        request = kernel.recv(4096)
    assert struct.unpack_from("=HH", request, 4) == (rtnl.RTM_GETROUTE, rtnl.NLM_F_REQUEST | rtnl.NLM_F_DUMP)
    assert got == {NET("198.18.0.0/24"): {("198.19.0.1", 7)}, NET("198.18.0.7/32"): {("", 9)},
                   NET("198.18.4.0/24"): {("198.19.0.1", 5), ("198.19.0.3", 6)}}


def test_every_route_is_acknowledged_and_a_refusal_names_the_route():
    routes = [rtnl.RouteAdd(NET(f"198.18.{i}.0/24"), (("198.19.0.1", 5),)) for i in range(3)]
    ours, kernel = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    with ours, kernel:
        kernel.send(b"".join(_reply(rtnl.NLMSG_ERROR, seq, struct.pack("=i", 0) + b"\0" * 16) for seq in (1, 2, 3)))
        rtnl.add_routes(ours, routes)
        sent = kernel.recv(1 << 16)
        assert [struct.unpack_from("=I", m, 8)[0] for m in _split(sent)] == [1, 2, 3]
        kernel.send(_reply(rtnl.NLMSG_ERROR, 1, struct.pack("=i", 0) + b"\0" * 16)
                    + _reply(rtnl.NLMSG_ERROR, 2, struct.pack("=i", -errno.EEXIST) + b"\0" * 16))
        with pytest.raises(rtnl.RtnlError, match=r"198\.18\.1\.0/24.*File exists") as e:
            rtnl.add_routes(ours, routes)
    assert e.value.errno == errno.EEXIST


def test_a_reply_that_overruns_its_datagram_is_refused():
    ours, kernel = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    with ours, kernel:
        kernel.send(struct.pack("=IHHII", 400, rtnl.NLMSG_DONE, 0, 1, 0))
        with pytest.raises(rtnl.RtnlError, match="overruns"):
            rtnl.main_routes(ours)


def _split(data: bytes) -> list[bytes]:
    out, off = [], 0
    while off < len(data):
        length = struct.unpack_from("=I", data, off)[0]
        out.append(data[off:off + length])
        off += (length + 3) & ~3
    return out


TC_CASES = [
    ("add", "htb", 0x10000, {"default": 1}),
    ("add-class", "htb", 0x10001, {"parent": 0x10000, "rate": 50_000_000, "ceil": 50_000_000, "burst": 8600,
                                   "cburst": 8600, "quantum": 4214, "mtu": 4214}),
    ("add", "bfifo", 0x100000, {"parent": 0x10001, "limit": 16_000_000}),
    ("add", "tbf", 0x200000, {"parent": 0x10010, "rate": 200_000_000, "burst": 20_000, "limit": 90_000,
                              "mtu": 4214}),
    ("add", "netem", 0x10000, {"delay": 15000.0, "limit": 1000, "loss": 0.01, "prob_corrupt": 0.0}),
    ("add", "clsact", 0, {}),
    ("add-filter", "bpf", 1, {"fd": 7, "name": "bp_tc_ingress", "parent": 0xFFFFFFF2, "classid": 1,
                              "direct_action": True}),
]


@pytest.mark.parametrize("command,kind,handle,kwargs", TC_CASES, ids=[f"{c[0]}-{c[1]}" for c in TC_CASES])
def test_a_tc_message_is_what_ipr_tc_would_send_for_that_port(command, kind, handle, kwargs):
    from emulator.fabric import queues  # noqa: F401 - names bfifo among pyroute2's tc plugins

    for ifindex in (100, 2345):  # one template, any port
        batch = IPBatch()
        batch.tc(command, kind, ifindex, handle, **dict(kwargs))
        theirs = bytes(batch.batch)
        ours = rtnl.tc_message(command, kind, ifindex, handle, **kwargs)
        assert ours[:8] == theirs[:8] and ours[16:] == theirs[16:]


@pytest.mark.parametrize("address", ["198.19.0.3/31", "198.18.0.1/32"])
def test_an_address_and_a_link_up_are_what_pyroute2_would_send(address):
    iface = ipaddress.IPv4Interface(address)
    batch = IPBatch()
    batch.addr("add", index=105, address=str(iface.ip), prefixlen=iface.network.prefixlen)
    theirs = bytes(batch.batch)
    ours = rtnl.addr_message(105, iface)
    assert ours[:8] == theirs[:8] and ours[16:] == theirs[16:]
    batch = IPBatch()
    batch.link("set", index=105, state="up")
    theirs = bytes(batch.batch)
    ours = rtnl.link_up_message(105)
    assert ours[:8] == theirs[:8] and ours[16:] == theirs[16:]
