"""The soft-NIC against Linux Soft-RoCE (rdma_rxe) through libibverbs, in both directions: WRITE,
WRITE_WITH_IMM, SEND, SEND_WITH_IMM and READ, 1 B to 64 KiB across the 1024-byte path MTU, both
of the soft-NIC's transports, one packet lost on the wire each way, RNR both ways; then every
packet of the run, captured on the wire, decoded by tshark and its ICRC recomputed here.

Needs a kernel with rdma_rxe: these machines run it in the delay tier's VM (`make vm-test`
runs `make test-rxe` there); elsewhere without rdma_rxe it is skipped with the fix, and in
the VM a missing capability fails.
"""
from __future__ import annotations

import os
import struct
import subprocess
import zlib
from collections import Counter
from pathlib import Path

import pytest

from emulator.errors import CapabilityError
from emulator.fabric import rxe
from emulator.workload import interop

IN_VM = os.environ.get("BACKPLANE_IN_VM") == "1"
CASES = interop.matrix()


class Run:
    def __init__(self, rig: interop.Rig, pcap: Path, capture) -> None:
        self.rig, self.pcap, self._capture = rig, pcap, capture
        self.outcomes: list[interop.Outcome] = []

    def stop_capture(self) -> None:
        if self._capture is not None:
            self._capture.__exit__(None, None, None)
            self._capture = None


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    try:
        rxe.check()
    except CapabilityError as e:
        if IN_VM:
            raise
        pytest.skip(f"{e.what}; fix: {e.fix}")
    pcap = tmp_path_factory.mktemp("rxe") / "interop.pcap"
    with rxe.rxe_link() as link:
        rig = interop.Rig(link)
        capture = interop.capture(link.netdev, pcap)
        capture.__enter__()
        r = Run(rig, pcap, capture)
        try:
            yield r
        finally:
            r.stop_capture()
            rig.close()


@pytest.mark.parametrize("case", CASES, ids=[c.name.replace(" ", "-") for c in CASES])
def test_interop(run, case):
    out = run.rig.run(case)
    run.outcomes.append(out)
    assert out.ok, out.detail
    if case.loss:
        assert out.injected == 1
        if case.requester == "softnic":
            # rxe answers the hole with a NAK (or its next READ response shows it): the soft-NIC,
            # selective or not, goes back at once, never waiting out a timeout.
            assert out.timeouts == 0 and out.retransmits >= 1, out
    if case.rnr:
        assert out.rnr_naks >= 1


# --- the wire, checked by tools that share no code with the soft-NIC ---

def read_pcap(path: Path) -> list[bytes]:
    """Frames of a classic pcap file (tcpdump -w), Ethernet link type."""
    data = path.read_bytes()
    magic, _, _, _, _, _, linktype = struct.unpack_from("<IHHiIII", data)
    assert magic == 0xA1B2C3D4 and linktype == 1, (hex(magic), linktype)
    frames, pos = [], 24
    while pos < len(data):
        _, _, caplen, wirelen = struct.unpack_from("<IIII", data, pos)
        assert caplen == wirelen, "a truncated capture"
        frames.append(data[pos + 16:pos + 16 + caplen])
        pos += 16 + caplen
    return frames


def icrc_of(frame: bytes) -> bytes:
    """IBTA A17.3.3, written out here: CRC-32 over 8 bytes of ones (the LRH that RoCEv2 lacks),
    the IPv4 header with TOS, TTL and checksum as ones, the UDP header with its checksum as ones,
    the BTH with its FECN/BECN/reserved byte as ones, and the rest but the ICRC itself."""
    ihl = (frame[14] & 0xF) * 4
    ip = bytearray(frame[14:14 + ihl])
    ip[1], ip[8], ip[10:12] = 0xFF, 0xFF, b"\xff\xff"
    udp = bytearray(frame[14 + ihl:22 + ihl])
    udp[6:8] = b"\xff\xff"
    ip_len = struct.unpack_from("!H", frame, 16)[0]
    bth = bytearray(frame[22 + ihl:14 + ip_len - 4])
    bth[4] = 0xFF
    return struct.pack("<I", zlib.crc32(b"\xff" * 8 + bytes(ip) + bytes(udp) + bytes(bth)))


def _error_below_payload(row: list[str]) -> bool:
    """Whether tshark found a frame malformed, or said anything about it, in Ethernet, IP, UDP
    or InfiniBand. The payloads are random bytes, so its guesses at a protocol inside them (RPC
    over RDMA, Ethernet over IB, ...) may fail: that says nothing about RoCEv2."""
    _, _, protocols, malformed, experts = (row + [""] * 5)[:5]
    layers = protocols.split(":")
    payload = set(layers[layers.index("infiniband") + 1:]) if "infiniband" in layers else set()
    for m in filter(None, malformed.split("|")):
        if m.startswith("[Malformed Packet: "):
            name = m[len("[Malformed Packet: "):].rstrip("]").lower()
            if name not in payload:
                return True
    return any(e and e != "Malformed Packet (Exception occurred)" for e in experts.split("|")) or \
        (bool(experts) and not malformed)


def test_every_packet_on_the_wire(run):
    """After the matrix: each RoCEv2 packet tshark decodes as InfiniBand without an error, and
    each ICRC (the soft-NIC's and rxe's) is what the standard's algorithm gives, itself checked
    against scapy's RoCE layer on a sample of every opcode."""
    if len(run.outcomes) != len(CASES):
        pytest.skip("the matrix did not run in full (run the whole module)")
    run.stop_capture()
    frames = read_pcap(run.pcap)
    assert len(frames) > 10 * len(CASES)
    bad = [i + 1 for i, f in enumerate(frames) if icrc_of(f) != f[14 + struct.unpack_from("!H", f, 16)[0] - 4:][:4]]
    assert not bad, f"{len(bad)} frames with a wrong ICRC, first {bad[:10]}"

    from scapy.contrib.roce import BTH
    from scapy.layers.l2 import Ether

    sample: dict[int, list[bytes]] = {}
    for f in frames:
        op = f[14 + (f[14] & 0xF) * 4 + 8]
        if len(sample.setdefault(op, [])) < 5:
            sample[op].append(f)
    for op, fs in sample.items():
        for f in fs:
            pkt = Ether(f)
            assert pkt[BTH].compute_icrc(None) == icrc_of(f), f"opcode {op:#x}: scapy and the check here disagree"

    r = subprocess.run(["tshark", "-n", "-r", str(run.pcap), "-T", "fields", "-E", "separator=\t", "-E", "aggregator=|",
                        "-e", "frame.number", "-e", "infiniband.bth.opcode", "-e", "frame.protocols",
                        "-e", "_ws.malformed", "-e", "_ws.expert.message"],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr
    rows = [line.split("\t") for line in r.stdout.splitlines()]
    assert len(rows) == len(frames)
    undecoded = [row[0] for row in rows if not row[1]]
    assert not undecoded, f"{len(undecoded)} frames not decoded as RoCEv2, first {undecoded[:10]}"
    errors = [row for row in rows if _error_below_payload(row)]
    assert not errors, f"{len(errors)} frames with tshark errors, first {errors[:5]}"
    opcodes = Counter(int(row[1]) for row in rows)
    # Every operation's packets were seen, and the soft-NIC's ACKs and rxe's.
    for name in ("WRITE_FIRST", "WRITE_LAST_IMM", "WRITE_ONLY", "WRITE_ONLY_IMM", "SEND_FIRST", "SEND_LAST_IMM",
                 "SEND_ONLY", "READ_REQUEST", "READ_RESPONSE_FIRST", "READ_RESPONSE_MIDDLE", "READ_RESPONSE_ONLY",
                 "ACKNOWLEDGE"):
        from emulator.nic import wire

        assert opcodes[getattr(wire, name)] > 0, f"no {name} on the wire"
