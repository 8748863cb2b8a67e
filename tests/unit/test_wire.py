"""RoCEv2 wire format: byte vectors held against scapy.contrib.roce (BTH, AETH, ICRC), parsing
that refuses malformed packets with a reason, PSN arithmetic across the 2^24 wrap."""
from __future__ import annotations

import random

import pytest
from scapy.contrib.roce import AETH, BTH
from scapy.layers.inet import IP, UDP

from emulator.nic import wire as W

RNG = random.Random(4791)


def random_bth(opcode=W.WRITE_MIDDLE) -> W.Bth:
    return W.Bth(opcode, RNG.randrange(1 << 24), RNG.randrange(1 << 24), solicited=bool(RNG.getrandbits(1)),
                 migreq=bool(RNG.getrandbits(1)), pkey=RNG.randrange(1 << 16), fecn=bool(RNG.getrandbits(1)),
                 becn=bool(RNG.getrandbits(1)), ackreq=bool(RNG.getrandbits(1)))


def scapy_roce(bth: W.Bth, payload: bytes, src="198.18.0.2", dst="198.18.2.2", sport=49152, tos=0x6A, ttl=61,
               ident=0, extra=b""):
    return (IP(src=src, dst=dst, tos=tos, ttl=ttl, id=ident, flags="DF") / UDP(sport=sport, dport=4791, chksum=0) /
            BTH(opcode=bth.opcode, solicited=bth.solicited, migreq=bth.migreq, padcount=bth.padcount,
                pkey=bth.pkey, fecn=bth.fecn, becn=bth.becn, dqpn=bth.dqpn, ackreq=bth.ackreq, psn=bth.psn) /
            (extra + payload))


@pytest.mark.parametrize("i", range(50))
def test_bth_bytes_equal_scapys(i):
    bth = random_bth()
    ours = bth.pack()
    theirs = bytes(scapy_roce(bth, b"")[BTH])[:12]
    assert ours == theirs
    assert W.Bth.unpack(ours) == bth


def test_aeth_bytes_equal_scapys():
    for syndrome, msn in ((W.AETH_ACK | 0x1F, 7), (W.NAK_PSN_SEQUENCE_ERROR, 0xABCDEF), (W.AETH_RNR_NAK | 3, 1)):
        assert W.Aeth(syndrome, msn).pack() == bytes(AETH(syndrome=syndrome, msn=msn))


@pytest.mark.parametrize("size", [0, 1, 3, 4, 1024, 4096])
def test_icrc_equals_scapys_and_parse_checks_it(size):
    payload = bytes(RNG.randrange(256) for _ in range(size))
    bth = random_bth(W.WRITE_MIDDLE if size % 4 == 0 else W.SEND_ONLY)
    transport = W.build(bth, payload)  # pads the payload to 4 bytes and sets PadCnt
    pad = -size % 4
    parsed_bth = W.Bth.unpack(transport)
    ref = scapy_roce(parsed_bth, payload + bytes(pad))
    built = bytes(ref)  # scapy appends its ICRC
    ip, udp = W.ipv4_udp_headers("198.18.0.2", "198.18.2.2", 49152, len(transport) + 4, tos=0x6A, ttl=61)
    ours = W.icrc(ip, udp, transport)
    assert ours == built[-4:]
    # The masked fields (TOS, TTL, checksum, FECN/BECN) may change in flight without breaking it.
    ip2 = bytearray(ip)
    ip2[1], ip2[8] = 0x6B, 12
    pkt = W.parse(transport + ours, bytes(ip2), udp)
    assert pkt.payload == payload and pkt.bth.psn == bth.psn
    corrupted = bytearray(transport + ours)
    corrupted[-5] ^= 0x01
    with pytest.raises(W.Malformed) as e:
        W.parse(bytes(corrupted), ip, udp)
    assert e.value.reason == "bad_icrc"


def test_extension_headers_round_trip():
    reth = W.Reth(0x1000_2000_3000, 0xDEADBEEF, 65536)
    t = W.build(W.Bth(W.WRITE_FIRST, 5, 9), bytes(4096), reth=reth) + bytes(4)
    assert W.parse(t).reth == reth
    t = W.build(W.Bth(W.WRITE_ONLY_IMM, 5, 9), b"abcd", reth=reth, imm=0x12345678) + bytes(4)
    p = W.parse(t)
    assert (p.reth, p.imm, p.payload) == (reth, 0x12345678, b"abcd")
    t = W.build(W.Bth(W.ACKNOWLEDGE, 5, 9), aeth=W.Aeth(W.NAK_PSN_SEQUENCE_ERROR, 3)) + bytes(4)
    a = W.parse(t).aeth
    assert a.is_nak and not a.is_ack and a.syndrome == W.NAK_PSN_SEQUENCE_ERROR and a.msn == 3
    t = W.build(W.Bth(W.CNP, 0x42, 0, becn=True)) + bytes(4)
    assert len(t) == 12 + 16 + 4 and W.parse(t).bth.becn
    with pytest.raises(ValueError):
        W.build(W.Bth(W.WRITE_FIRST, 5, 9), b"x")  # a RETH is required


@pytest.mark.parametrize("data,reason", [
    (b"\x07\x00\xff", "truncated"),
    (W.Bth(0x55, 1, 1).pack() + bytes(4), "unknown_opcode"),
    (W.Bth(W.SEND_ONLY, 1, 1, tver=1).pack() + bytes(4), "bad_version"),
    (W.Bth(W.WRITE_FIRST, 1, 1).pack() + bytes(8), "truncated"),
    (W.Bth(W.ACKNOWLEDGE, 1, 1).pack() + bytes(2), "truncated"),
    (W.Bth(W.SEND_ONLY, 1, 1, padcount=3).pack() + bytes(4), "bad_padding"),
])
def test_malformed_packets_are_refused_with_a_reason(data, reason):
    with pytest.raises(W.Malformed) as e:
        W.parse(data)
    assert e.value.reason == reason


def test_psn_arithmetic_wraps_at_2_24():
    top = W.PSN_MOD - 1
    assert W.psn_add(top, 1) == 0 and W.psn_add(top, 5) == 4
    assert W.psn_diff(2, top) == 3 and W.psn_diff(top, 2) == -3
    assert W.psn_lt(top, 0) and not W.psn_lt(0, top)
    assert W.psn_diff(W.PSN_MOD // 2, 0) == W.PSN_MOD // 2
