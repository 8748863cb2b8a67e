"""The datapath's builds: the full switch model, and the forward-only floor that
bench/forwarding.py measures beside it (emulator.bpf.datapath.BUILDS)."""
from __future__ import annotations

import pytest

from emulator.bpf.datapath import BUILD_ENV, TC_EGRESS_PROG, Datapath
from emulator.errors import FabricError

from .conftest import IN_PORT, NEXT_HOPS, program
from .test_programs import TC_ACT_OK, forwarded, roce, run_tc


@pytest.fixture
def floor(ns, monkeypatch):
    monkeypatch.setenv(BUILD_ENV, "forward-only")
    d = Datapath()
    yield program(d)
    d.close()


def test_the_floor_forwards_as_the_full_build_and_models_nothing(programmed, floor):
    assert programmed.build == "full" and floor.build == "forward-only"
    for qpn in range(16):
        data = roce(qpn=qpn)
        before = {port: floor.counters(port) for port in [IN_PORT, *NEXT_HOPS]}
        chosen = forwarded(floor, data)
        assert chosen == forwarded(programmed, data)
        # The egress hook is called and does nothing: no queue grows (the full build's does), no
        # counter moves.
        queued, floor_queued = programmed.queue(IN_PORT)["enq_bytes"], floor.queue(IN_PORT)["enq_bytes"]
        assert run_tc(programmed, TC_EGRESS_PROG, data).retval == TC_ACT_OK
        assert programmed.queue(IN_PORT)["enq_bytes"] == queued + len(data)
        out = run_tc(floor, TC_EGRESS_PROG, data)
        assert out.retval == TC_ACT_OK and out.data == data
        assert floor.queue(IN_PORT)["enq_bytes"] == floor_queued
        assert {port: floor.counters(port) for port in before} == before


def test_an_unknown_build_is_refused_by_name(ns, monkeypatch):
    monkeypatch.setenv(BUILD_ENV, "fast")
    with pytest.raises(FabricError, match=f"{BUILD_ENV}='fast'.*full, forward-only"):
        Datapath()
