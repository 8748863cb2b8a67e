"""A scratch namespace for timing the datapath's programs with BPF_PROG_TEST_RUN: the programs
loaded once, two veth ends numbered 201 (a switch port) and 202 (the port at the far end of its
wire), and a RoCEv2 frame to run them on. Removed on exit, whatever happens."""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Iterator

from pyroute2 import IPRoute
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether

from emulator.bpf import structs as S
from emulator.bpf.datapath import Datapath
from emulator.fabric import netns

SWITCH_PORT, FAR_PORT = 201, 202
MAC = S.mac_bytes("02:62:70:00:07:00")


@dataclass
class Probe:
    datapath: Datapath
    netns: str
    frame: bytes  # Ethernet, IPv4 (DSCP 26, ECT), UDP to 4791, a zeroed BTH and a 1 KB payload


def roce_frame(qpn: int = 0, ttl: int = 64) -> bytes:
    bth = bytes(4) + qpn.to_bytes(4, "big") + bytes(4)  # opcode..pkey, rsvd + dest QP, PSN
    return bytes(Ether(src="02:62:70:00:07:00", dst="02:62:70:00:07:01") /
                 IP(src="198.18.0.2", dst="198.18.1.2", tos=(26 << 2) | 2, ttl=ttl) /
                 UDP(sport=49152, dport=S.ROCE_PORT, chksum=0) / (bth + bytes(1024 + 4)))  # one page holds it


@contextlib.contextmanager
def probe() -> Iterator[Probe]:
    ns = f"bp-probe-bench{os.getpid()}"
    dp = Datapath()
    netns.create(ns)
    try:
        with netns.entered(ns):
            ipr = IPRoute()
        try:
            # pyroute2 cannot number a veth's peer, so each port is its own veth's named end.
            ipr.link("add", ifname="sw0", kind="veth", index=SWITCH_PORT, peer={"ifname": "peer0"})
            ipr.link("add", ifname="far0", kind="veth", index=FAR_PORT, peer={"ifname": "peer1"})
        finally:
            ipr.close()
        with netns.entered(ns):
            yield Probe(dp, ns, roce_frame())
    finally:
        netns.remove(ns)
        dp.close()
