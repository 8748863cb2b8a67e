"""RoCEv2 on the wire (IBTA Annex A17): BTH, RETH, AETH, immediate data, CNP and the ICRC.

Pure functions over bytes, no I/O. Field layouts follow scapy.contrib.roce (and the tests hold
them to it byte for byte). Parsing refuses anything malformed with a typed reason, so a NIC can
count every rejected packet by why.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

try:  # zlib's CRC-32, computed with the CPU's carry-less multiply (8x zlib's speed per 4 KB frame)
    from zlib_ng.zlib_ng import crc32
except ImportError as e:  # pragma: no cover - setup installs it
    raise ImportError("the soft-NIC's ICRC needs the zlib-ng package: run `sudo make setup` "
                      "(or `.venv/bin/pip install -r requirements.txt`)") from e

ROCE_PORT = 4791
# The QoS policy by DSCP, as production RoCE fabrics set it: data on the lossless priority,
# CNPs on a strict-priority class of their own; the switches map these (bpf.datapath).
DSCP_DATA = 26
DSCP_CNP = 48  # CNPs go out non-ECT with DSCP 48, as NICs send them
ECT0, CE = 0b10, 0b11  # the IP header's ECN field: data is sent ECN-capable; switches mark CE
PSN_MOD = 1 << 24
QPN_MASK = 0xFFFFFF
PKEY_DEFAULT = 0xFFFF
ICRC_LEN = 4

# RC opcodes (transport 0x00 + operation).
SEND_FIRST, SEND_MIDDLE, SEND_LAST, SEND_LAST_IMM, SEND_ONLY, SEND_ONLY_IMM = range(0x00, 0x06)
WRITE_FIRST, WRITE_MIDDLE, WRITE_LAST, WRITE_LAST_IMM, WRITE_ONLY, WRITE_ONLY_IMM = range(0x06, 0x0C)
READ_REQUEST = 0x0C
READ_RESPONSE_FIRST, READ_RESPONSE_MIDDLE, READ_RESPONSE_LAST, READ_RESPONSE_ONLY = range(0x0D, 0x11)
ACKNOWLEDGE = 0x11
CNP = 0x81

OPCODE_NAMES = {
    SEND_FIRST: "SEND_FIRST", SEND_MIDDLE: "SEND_MIDDLE", SEND_LAST: "SEND_LAST",
    SEND_LAST_IMM: "SEND_LAST_WITH_IMMEDIATE", SEND_ONLY: "SEND_ONLY", SEND_ONLY_IMM: "SEND_ONLY_WITH_IMMEDIATE",
    WRITE_FIRST: "RDMA_WRITE_FIRST", WRITE_MIDDLE: "RDMA_WRITE_MIDDLE", WRITE_LAST: "RDMA_WRITE_LAST",
    WRITE_LAST_IMM: "RDMA_WRITE_LAST_WITH_IMMEDIATE", WRITE_ONLY: "RDMA_WRITE_ONLY",
    WRITE_ONLY_IMM: "RDMA_WRITE_ONLY_WITH_IMMEDIATE", READ_REQUEST: "RDMA_READ_REQUEST",
    READ_RESPONSE_FIRST: "RDMA_READ_RESPONSE_FIRST", READ_RESPONSE_MIDDLE: "RDMA_READ_RESPONSE_MIDDLE",
    READ_RESPONSE_LAST: "RDMA_READ_RESPONSE_LAST", READ_RESPONSE_ONLY: "RDMA_READ_RESPONSE_ONLY",
    ACKNOWLEDGE: "ACKNOWLEDGE", CNP: "CNP",
}
# Which extension headers follow the BTH, per opcode.
WITH_RETH = {WRITE_FIRST, WRITE_ONLY, WRITE_ONLY_IMM, READ_REQUEST}
WITH_IMM = {SEND_LAST_IMM, SEND_ONLY_IMM, WRITE_LAST_IMM, WRITE_ONLY_IMM}
WITH_AETH = {ACKNOWLEDGE, READ_RESPONSE_FIRST, READ_RESPONSE_LAST, READ_RESPONSE_ONLY}
CNP_PAD = 16  # reserved bytes after a CNP's BTH

# AETH syndromes: the top 3 bits say what it is.
AETH_ACK = 0x00  # | credit count
AETH_RNR_NAK = 0x20  # | timer
NAK_PSN_SEQUENCE_ERROR = 0x60
NAK_INVALID_REQUEST = 0x61
NAK_REMOTE_ACCESS_ERROR = 0x62
NAK_REMOTE_OPERATIONAL_ERROR = 0x63
NAK_INVALID_RD_REQUEST = 0x64

BTH_LEN, RETH_LEN, AETH_LEN, IMM_LEN = 12, 16, 4, 4
# The headers' layouts, the one definition in Python (ebpf/include/bp_parse.h's struct bp_bth is
# checked against BTH_STRUCT by tests/datapath): opcode, flags (SE, M, PadCnt, TVer), P_Key,
# FECN|BECN|resv + DestQP, AckReq|resv + PSN; then VA, R_Key, length; AETH; immediate data.
BTH_STRUCT = struct.Struct("!BBHII")
RETH_STRUCT = struct.Struct("!QII")
AETH_STRUCT = struct.Struct("!I")
IMM_STRUCT = struct.Struct("!I")
BTH_AETH_STRUCT = struct.Struct("!BBHIII")  # an ACK's transport header, packed in one call


class Malformed(ValueError):
    """A packet the NIC must drop; ``reason`` is the counter it is counted under."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


@dataclass(frozen=True)
class Bth:
    opcode: int
    dqpn: int
    psn: int
    solicited: bool = False
    migreq: bool = False
    padcount: int = 0
    tver: int = 0
    pkey: int = PKEY_DEFAULT
    fecn: bool = False
    becn: bool = False
    ackreq: bool = False

    def pack(self) -> bytes:
        flags = (self.solicited << 7) | (self.migreq << 6) | ((self.padcount & 3) << 4) | (self.tver & 0xF)
        qpn = (self.fecn << 31) | (self.becn << 30) | (self.dqpn & QPN_MASK)
        psn = (self.ackreq << 31) | (self.psn & QPN_MASK)
        return BTH_STRUCT.pack(self.opcode, flags, self.pkey, qpn, psn)

    @classmethod
    def unpack(cls, data: bytes | memoryview) -> "Bth":
        if len(data) < BTH_LEN:
            raise Malformed("truncated", f"{len(data)} bytes, a BTH needs {BTH_LEN}")
        opcode, flags, pkey, qpn, psn = BTH_STRUCT.unpack_from(data)
        return cls(opcode, qpn & QPN_MASK, psn & QPN_MASK, bool(flags >> 7), bool(flags >> 6 & 1),
                   flags >> 4 & 3, flags & 0xF, pkey, bool(qpn >> 31), bool(qpn >> 30 & 1), bool(psn >> 31))


@dataclass(frozen=True)
class Reth:
    va: int
    rkey: int
    length: int

    def pack(self) -> bytes:
        return RETH_STRUCT.pack(self.va, self.rkey, self.length)


@dataclass(frozen=True)
class Aeth:
    syndrome: int
    msn: int

    def pack(self) -> bytes:
        return AETH_STRUCT.pack((self.syndrome << 24) | (self.msn & QPN_MASK))

    @property
    def is_ack(self) -> bool:
        return self.syndrome >> 5 == 0

    @property
    def is_nak(self) -> bool:
        return self.syndrome >> 5 == 3


@dataclass(frozen=True)
class Packet:
    """A parsed RoCEv2 transport packet (what follows the UDP header, ICRC checked)."""

    bth: Bth
    reth: Reth | None
    aeth: Aeth | None
    imm: int | None
    payload: bytes


def build(bth: Bth, payload: bytes = b"", reth: Reth | None = None, aeth: Aeth | None = None,
          imm: int | None = None) -> bytes:
    """BTH + extension headers + payload (padded to 4 bytes, PadCnt set), without the ICRC."""
    op = bth.opcode
    if (op in WITH_RETH) != (reth is not None) or (op in WITH_AETH) != (aeth is not None) \
            or (op in WITH_IMM) != (imm is not None):
        raise ValueError(f"{OPCODE_NAMES.get(op, hex(op))}: wrong extension headers")
    pad = -len(payload) % 4
    if pad != bth.padcount:
        bth = Bth(**{**bth.__dict__, "padcount": pad})
    out = bth.pack()
    if reth is not None:
        out += reth.pack()
    if imm is not None:
        out += IMM_STRUCT.pack(imm)
    if aeth is not None:
        out += aeth.pack()
    if op == CNP:
        out += bytes(CNP_PAD)
    return out + payload + bytes(pad)


def icrc_headers(ip_header: bytes, udp_header: bytes) -> int:
    """The ICRC's running CRC-32 over 8 bytes of 0xFF (the pseudo LRH), the IPv4 header with
    TOS, TTL and checksum masked to ones and the UDP header with its checksum masked. It depends
    on the headers only, so a sender can keep it per destination and length."""
    ip = bytearray(ip_header)
    ip[1] = 0xFF  # TOS (DSCP, ECN)
    ip[8] = 0xFF  # TTL
    ip[10:12] = b"\xff\xff"  # header checksum
    udp = bytearray(udp_header)
    udp[6:8] = b"\xff\xff"
    return crc32(b"\xff" * 8 + bytes(ip) + bytes(udp))


def icrc_bth_head(crc: int, first_word: bytes | memoryview) -> int:
    """Continue ``crc`` over the BTH's first word and its FECN/BECN/reserved byte, masked to
    ones: what follows depends on the packet, this only on its opcode, flags and P_Key (a
    sender can keep it per length and first word)."""
    return crc32(b"\xff", crc32(first_word[:4], crc))


def icrc_transport(crc: int, parts) -> int:
    """Continue ``crc`` over the BTH (its FECN/BECN/reserved byte masked) and what follows it,
    given as consecutive buffers, the first holding at least the BTH."""
    first = parts[0]
    crc = crc32(first[5:], icrc_bth_head(crc, first))
    for p in parts[1:]:
        crc = crc32(p, crc)
    return crc


def icrc(ip_header: bytes, udp_header: bytes, transport: bytes) -> bytes:
    """The invariant CRC of a packet, little-endian as it goes on the wire."""
    return struct.pack("<I", icrc_transport(icrc_headers(ip_header, udp_header), [transport]))


def ipv4_udp_headers(src: str, dst: str, sport: int, transport_len: int, tos: int = 0, ttl: int = 64,
                     ident: int = 0, df: bool = True) -> tuple[bytes, bytes]:
    """The IPv4 and UDP headers a packet of ``transport_len`` bytes (BTH..ICRC) carries, as the
    ICRC sees them (the masked fields do not matter; UDP checksum 0 as RoCEv2 sends)."""
    import socket

    total = 20 + 8 + transport_len
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, tos, total, ident, 0x4000 if df else 0, ttl, 17, 0,
                     socket.inet_aton(src), socket.inet_aton(dst))
    udp = struct.pack("!HHHH", sport, ROCE_PORT, 8 + transport_len, 0)
    return ip, udp


def parse(transport: bytes | memoryview, ip_header: bytes | None = None, udp_header: bytes | None = None) -> Packet:
    """BTH..ICRC -> Packet. With the IP and UDP headers the ICRC is checked too."""
    data = bytes(transport)
    bth = Bth.unpack(data)
    op = bth.opcode
    if op not in OPCODE_NAMES:
        raise Malformed("unknown_opcode", hex(op))
    if bth.tver != 0:
        raise Malformed("bad_version", f"transport version {bth.tver}")
    need = BTH_LEN + (RETH_LEN if op in WITH_RETH else 0) + (IMM_LEN if op in WITH_IMM else 0) \
        + (AETH_LEN if op in WITH_AETH else 0) + (CNP_PAD if op == CNP else 0) + ICRC_LEN
    if len(data) < need:
        raise Malformed("truncated", f"{OPCODE_NAMES[op]} needs {need} bytes, got {len(data)}")
    if ip_header is not None and udp_header is not None:
        if icrc(ip_header, udp_header, data[:-ICRC_LEN]) != data[-ICRC_LEN:]:
            raise Malformed("bad_icrc")
    pos = BTH_LEN
    reth = aeth = imm = None
    if op in WITH_RETH:
        reth = Reth(*RETH_STRUCT.unpack_from(data, pos))
        pos += RETH_LEN
    if op in WITH_IMM:
        imm = IMM_STRUCT.unpack_from(data, pos)[0]
        pos += IMM_LEN
    if op in WITH_AETH:
        word = AETH_STRUCT.unpack_from(data, pos)[0]
        aeth = Aeth(word >> 24, word & QPN_MASK)
        pos += AETH_LEN
    if op == CNP:
        pos += CNP_PAD
    body = data[pos:-ICRC_LEN]
    if bth.padcount > len(body):
        raise Malformed("bad_padding", f"PadCnt {bth.padcount} with {len(body)} payload bytes")
    return Packet(bth, reth, aeth, imm, body[:len(body) - bth.padcount])


_PLAIN_WRITE = frozenset((WRITE_MIDDLE, WRITE_LAST))


def plain_write(transport: memoryview) -> tuple[int, int, int, bool, memoryview] | None:
    """(DestQP, opcode, PSN, AckReq, payload) of a WRITE_MIDDLE or WRITE_LAST (BTH..ICRC,
    ICRC already checked): the bulk of RDMA traffic, which has no extension header, read
    without building a Packet; the payload is a view of ``transport``. None for any other
    packet, well formed or not: ``parse`` decides what it is."""
    opcode, flags, _, qpn, psn = BTH_STRUCT.unpack_from(transport)
    pad = flags >> 4 & 3
    end = len(transport) - ICRC_LEN - pad
    if opcode not in _PLAIN_WRITE or flags & 0xF or end < BTH_LEN:
        return None
    return qpn & QPN_MASK, opcode, psn & QPN_MASK, bool(psn >> 31), transport[BTH_LEN:end]


# --- PSN arithmetic, modulo 2^24 ---

def psn_add(psn: int, n: int) -> int:
    return (psn + n) % PSN_MOD


def psn_diff(a: int, b: int) -> int:
    """a - b as a signed distance in (-2^23, 2^23]: how far ``a`` is ahead of ``b``."""
    d = (a - b) % PSN_MOD
    return d - PSN_MOD if d > PSN_MOD // 2 else d


def psn_lt(a: int, b: int) -> bool:
    return psn_diff(a, b) < 0
