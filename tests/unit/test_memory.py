"""Memory regions: keys, bounds and rights are checked before a byte moves."""
from __future__ import annotations

import pytest

from emulator.nic.memory import LOCAL_WRITE, REMOTE_READ, REMOTE_WRITE, AccessError, ProtectionDomain


def test_write_then_read_inside_the_region():
    pd = ProtectionDomain()
    mr = pd.register(bytearray(64))
    mr.write(mr.va + 8, b"hello")
    assert mr.read(mr.va + 8, 5) == b"hello"
    found, off = pd.remote(mr.rkey, mr.va + 60, 4, REMOTE_WRITE)
    assert found is mr and off == 60


@pytest.mark.parametrize("va_off,length,reason", [(-1, 4, "out_of_bounds"), (61, 4, "out_of_bounds"),
                                                  (0, 65, "out_of_bounds"), (0, -1, "out_of_bounds")])
def test_accesses_outside_the_region_are_refused(va_off, length, reason):
    pd = ProtectionDomain()
    mr = pd.register(bytearray(64))
    with pytest.raises(AccessError) as e:
        pd.remote(mr.rkey, mr.va + va_off, length, REMOTE_WRITE)
    assert e.value.reason == reason
    assert mr.buffer == bytearray(64)


def test_wrong_key_and_missing_rights_are_refused():
    pd = ProtectionDomain()
    ro = pd.register(bytearray(16), access=LOCAL_WRITE | REMOTE_READ)
    with pytest.raises(AccessError) as e:
        pd.remote(ro.rkey ^ 1, ro.va, 1, REMOTE_READ)
    assert e.value.reason == "bad_rkey"
    with pytest.raises(AccessError) as e:
        ro.write(ro.va, b"x")
    assert e.value.reason == "access_denied"
    pd.deregister(ro)
    with pytest.raises(AccessError):
        pd.remote(ro.rkey, ro.va, 1, REMOTE_READ)


def test_regions_never_share_addresses_or_keys():
    pd = ProtectionDomain()
    a, b = pd.register(bytearray(100)), pd.register(bytearray(100))
    assert a.rkey != b.rkey and a.lkey != b.lkey
    assert a.va + a.length < b.va
