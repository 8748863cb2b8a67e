"""Lossless Ethernet under an 8-into-1 incast, run faithful with DCQCN off (topologies/pfc-incast.yaml).

What a user would check:
  - with PFC on, nothing is dropped anywhere: no headroom drop, no tail drop, no qdisc drop,
    and the data arrives intact;
  - the PAUSE frames are real 802.1Qbb frames: tshark decodes those leaf1 sent towards the spine
    as PFC, and their number equals the switch's own counters;
  - the pause spreads: a victim flow that shares only the spine's port to leaf1 slows down;
  - with PFC off the same incast drops.
Every run happens once; none is retried.
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest
import yaml

from emulator.control import client
from emulator.fabric import netns

from .conftest import REPO, TOPOLOGIES, bp, bp_json, nothing_left

SENDERS = ",".join(f"dc-host{i}" for i in range(8))
TARGET = "dc-host9"
VICTIM, VICTIM_DST = "dc-host8", "dc-host10"
SIZE = "8MB"  # per sender: 64 MB through the 100 Mb/s emulated port, about 5 s
VICTIM_SIZE = "2MB"
LOSSLESS = "3"
CAPTURE = ("dc-leaf1", "eth9")  # leaf1's port to the spine: the PAUSE frames it sends


def ports_by_name(stats: dict) -> dict[str, dict]:
    return {f"{p['node']}:{p['ifname']}": p for p in stats["ports"]}


def drops(stats: dict) -> dict[str, int]:
    """Every drop on the lossless path, by port and kind."""
    out = {}
    for name, p in ports_by_name(stats).items():
        c = p.get("counters") or {}
        for kind in ("drop_buffer", "drop_loss"):
            if c.get(kind):
                out[f"{name} {kind}"] = c[kind]
        if (p.get("qdisc") or {}).get("drops"):
            out[f"{name} qdisc"] = p["qdisc"]["drops"]
        pfc = (p.get("pfc") or {}).get(LOSSLESS)
        if pfc and pfc["drop_headroom"]:
            out[f"{name} headroom"] = pfc["drop_headroom"]
    return out


def start_transfer(name: str, src: str, dst: str, size: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "emulator.cli", "run", "transfer", "-n", name, src, dst,
                             "--size", size, "--json"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def finish(proc: subprocess.Popen, timeout: float = 300) -> dict:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err
    return json.loads(out)


def pauses_sent(name: str) -> int:
    return client.request(name, {"op": "pfc"})["pfc"]["pause_sent"]


@pytest.fixture(scope="module")
def lossless(tmp_path_factory):
    """The incast with PFC on, the victim alongside it, and a capture of leaf1's PAUSE frames."""
    name = "pfc"
    pcap = tmp_path_factory.mktemp("pfc") / "leaf1-eth9.pcap"
    bp("up", str(TOPOLOGIES / "pfc-incast.yaml"), "--name", name)
    try:
        alone = bp_json("run", "transfer", "-n", name, VICTIM, VICTIM_DST, "--size", VICTIM_SIZE)
        tcpdump = subprocess.Popen(netns.command(netns_of(name, CAPTURE[0]),
                                                 ["tcpdump", "-i", CAPTURE[1], "-U", "-w", str(pcap),
                                                  "ether", "proto", "0x8808"]),
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        line = tcpdump.stderr.readline()  # "listening on ...": from here on nothing is missed
        assert "listening on" in line, line
        try:
            incast = start_transfer(name, SENDERS, TARGET, SIZE)
            # The victim starts once the pause has reached the spine, so it runs inside it.
            deadline = time.monotonic() + 120
            while pauses_sent(name) == 0:
                assert incast.poll() is None and time.monotonic() < deadline, "no switch sent PAUSE"
                time.sleep(0.05)
            victim = start_transfer(name, VICTIM, VICTIM_DST, VICTIM_SIZE)
            during = finish(victim)
            r = finish(incast)
            stats = bp_json("stats", "-n", name)
            agent = client.request(name, {"op": "pfc"})["pfc"]
        finally:
            tcpdump.send_signal(signal.SIGINT)
            tcpdump.wait(timeout=30)
    finally:
        bp("clean", "--name", name, check=False)
        assert not nothing_left(name)
    return {"incast": r, "stats": stats, "alone": alone, "during": during, "pcap": pcap, "agent": agent}


def netns_of(fabric: str, node: str) -> str:
    return f"bp-{fabric}-{node}"


def test_pfc_on_drops_nothing(lossless):
    r, stats, agent = lossless["incast"], lossless["stats"], lossless["agent"]
    ports = ports_by_name(stats)
    sent = {n: p["pfc"][LOSSLESS]["tx_pause"] for n, p in ports.items() if p.get("pfc")}
    print(f"\nPFC on: goodput {r['goodput_bps'] / 1e6:.1f} Mb/s emulated, {r['retransmits']} resent; "
          f"PAUSE sent per port {({k: v for k, v in sent.items() if v})}; agent {agent}")
    assert r["intact"] and r["complete"]
    assert drops(stats) == {}
    # The pause spread hop by hop back to every sender.
    assert all(ports[f"dc-host{i}:eth0"]["pfc"][LOSSLESS]["rx_pause"] > 0 for i in range(8))
    assert ports["dc-spine0:eth0"]["pfc"][LOSSLESS]["tx_pause"] > 0
    assert agent["errors"] == []


def test_pause_frames_decode_as_pfc_and_match_the_counters(lossless):
    done = subprocess.run(["tshark", "-r", str(lossless["pcap"]), "-Y", "macc.opcode == 0x0101",
                           "-T", "fields", "-e", "macc.cbfc.enbv", "-e", "macc.cbfc.pause_time.c3"],
                          capture_output=True, text=True, check=True)
    frames = [line.split("\t") for line in done.stdout.splitlines() if line]
    pauses = sum(1 for vector, t in frames if int(vector, 0) == 1 << int(LOSSLESS) and int(t) > 0)
    resumes = sum(1 for vector, t in frames if int(vector, 0) == 1 << int(LOSSLESS) and int(t) == 0)
    counted = ports_by_name(lossless["stats"])[":".join(CAPTURE)]["pfc"][LOSSLESS]
    print(f"\ntshark: {pauses} PAUSE and {resumes} resume frames on {':'.join(CAPTURE)}; counters "
          f"{counted['tx_pause']} and {counted['tx_resume']}")
    assert pauses > 0
    assert len(frames) == pauses + resumes
    assert (pauses, resumes) == (counted["tx_pause"], counted["tx_resume"])


def test_the_pause_spreads_to_a_victim_flow(lossless):
    alone, during = lossless["alone"]["goodput_bps"], lossless["during"]["goodput_bps"]
    print(f"\nvictim {VICTIM} -> {VICTIM_DST}: {alone / 1e6:.1f} Mb/s alone, {during / 1e6:.1f} Mb/s beside the "
          "incast (emulated)")
    assert lossless["during"]["intact"]
    assert during < alone / 2


def test_pfc_off_the_same_incast_drops(tmp_path):
    doc = yaml.safe_load((TOPOLOGIES / "pfc-incast.yaml").read_text())
    doc["pfc"]["enabled"] = False
    topo = tmp_path / "incast-lossy.yaml"
    topo.write_text(yaml.safe_dump(doc))
    name = "nopfc"
    bp("up", str(topo), "--name", name)
    try:
        r = bp_json("run", "transfer", "-n", name, SENDERS, TARGET, "--size", SIZE)
        stats = bp_json("stats", "-n", name)
    finally:
        bp("clean", "--name", name, check=False)
        assert not nothing_left(name)
    lost = drops(stats)
    print(f"\nPFC off: {r['retransmits']} resent, drops {lost}")
    assert r["intact"] and r["complete"]
    assert sum(lost.values()) > 0 and r["retransmits"] > 0
