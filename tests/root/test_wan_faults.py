"""Faults on the long-haul paths' netem delay lines (the delay tier): a latency step lengthens a
path by the distance asked and bit errors drop on its netem; both held at once keep each other,
and restore gives the path back as built. Needs sch_netem; the host tier checks the eBPF side
(tests/root/test_faults.py)."""
from __future__ import annotations

import math

import pytest

from emulator.fabric import capabilities

from .conftest import bp, bp_json

pytestmark = pytest.mark.netem
if not capabilities.has_netem():
    pytest.skip("this kernel has no sch_netem: the delay tier runs in a VM with a stock kernel "
                "(sudo make vm-test)", allow_module_level=True)

PATH = 1
ONE_WAY_S = 3000 * 5e-6  # tiny's 3,000 km at 5 us/km
EXTRA_KM = 1000  # the re-routed path's extra length: 5 ms more each way
LOSS = 0.05
# What QEMU's software CPU adds to a round trip through the delay lines, 0.5-1.7 ms
# (test_delay.py), differs between two minima by up to as much.
TOLERANCE_S = 0.002


def lines(name: str) -> list[dict]:
    """What the kernel holds on the path's two delay lines (one each way)."""
    return [port["kernel"] for link in bp_json("status", "--name", name, "--no-rtt")["links"]
            for port in (link["a"], link["b"]) if link["kind"] == "wan" and link["path"] == PATH
            and port["kernel"].get("kind") == "netem"]


def far_border(name: str) -> str:
    """The west border's address on the path: the east border reaches it across that fiber only."""
    for link in bp_json("status", "--name", name, "--no-rtt")["links"]:
        for port in (link["a"], link["b"]):
            if link["kind"] == "wan" and link["path"] == PATH and port["node"] == "west-border0":
                return port["address"].split("/")[0]
    raise AssertionError(f"no west border on path {PATH}")


def min_rtt(name: str, address: str) -> float:
    out = bp("exec", "--name", name, "east-border0", "--", "ping", "-n", "-q", "-c", "5", "-i", "0.2", "-W", "2",
             address).stdout
    assert "5 received" in out, out
    return float(out.rsplit("=", 1)[1].split("/")[0]) / 1e3


def test_a_latency_step_and_bit_errors_on_a_path_compose_and_restore(fabrics):
    name = fabrics("twanf", "tiny")
    dilation = bp_json("status", "--name", name, "--no-rtt")["time_model"]["dilation"]
    address = far_border(name)
    built, rtt0 = lines(name), min_rtt(name, address)
    assert len(built) == 2 and all(math.isclose(k["delay_s"], ONE_WAY_S * dilation, rel_tol=1e-4) for k in built)

    bp("inject", "latency-step", "-n", name, f"wan{PATH}", "--extra", f"{EXTRA_KM}km")
    step = 2 * EXTRA_KM * 5e-6 * dilation
    rtt1 = min_rtt(name, address)
    bp("inject", "ber", "-n", name, f"wan{PATH}", "--loss", str(LOSS))
    both = lines(name)
    count = 2000
    lossy = bp_json("measure", "loss", "--name", name, "east-border0", "west-border0", "--path", str(PATH),
                    "--count", str(count), "--pps", "1000")
    bp("inject", "restore", "-n", name, f"wan{PATH}")
    back, rtt2 = lines(name), min_rtt(name, address)
    clean = bp_json("measure", "loss", "--name", name, "east-border0", "west-border0", "--path", str(PATH),
                    "--count", "500", "--pps", "1000")
    print(f"\nwan{PATH} min RTT {rtt0 * 1e3:.2f} ms; +{EXTRA_KM} km: {rtt1 * 1e3:.2f} ms (want +{step * 1e3:g} ms); "
          f"restored {rtt2 * 1e3:.2f} ms. Loss {LOSS}: observed {lossy['observed']:.4f} of {lossy['sent']}, "
          f"netem dropped {lossy['delay_line_drops']}; restored: {clean['sent'] - clean['received']} lost")
    # The step: never less than the longer fiber's round trip, and a ping sees it added (the
    # minima of a few pings each carry the emulated CPU's jitter, a fraction of a millisecond).
    assert rtt1 >= 2 * (ONE_WAY_S + EXTRA_KM * 5e-6) * dilation
    assert abs((rtt1 - rtt0) - step) <= TOLERANCE_S
    # Bit errors on top of the step: both held at once, and the loss is netem's.
    assert all(math.isclose(k["delay_s"], (ONE_WAY_S + EXTRA_KM * 5e-6) * dilation, rel_tol=1e-4) and
               math.isclose(k["loss"], LOSS, rel_tol=1e-3) for k in both), both
    sigma = math.sqrt(LOSS * (1 - LOSS) / count)
    assert lossy["sent"] == count and abs(lossy["observed"] - LOSS) <= 4 * sigma, lossy
    assert lossy["delay_line_drops"] == lossy["sent"] - lossy["received"], lossy
    # Restore: the path as built.
    assert [(k["delay_s"], k["loss"], k["limit_packets"]) for k in back] == \
        [(k["delay_s"], k["loss"], k["limit_packets"]) for k in built]
    assert abs(rtt2 - rtt0) <= TOLERANCE_S
    assert clean["received"] == clean["sent"] == 500 and clean["delay_line_drops"] == 0, clean
