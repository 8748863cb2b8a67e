"""The CLI's reports speak the real fabric's units: times / dilation, rates / scale, bytes /
(scale x dilation), with the time model on the first line (no kernel needed)."""
from __future__ import annotations

import json
from pathlib import Path

from emulator.cli import text as cli_text
from emulator.model.timemodel import TimeModel

TM = TimeModel.of(0.0005, "faithful")  # d = 2000


def _transfer() -> dict:
    qp = {"qpn": 0x100, "completed_s": 2.0, "data_packets": 100, "retransmits": 0, "timeouts": 0,
          "cnps_received": 3, "srtt_s": 0.002, "rto_s": 0.02, "error": None}
    nic = {"dropped": {}, "cnp_delay_s": {"p50": 0.001, "p90": 0.002, "max": 0.004}}
    return {
        "src": "dc-host0", "dst": "dc-host5", "size": 64_000_000, "qps": 1, "transport": "selective",
        "rtt_s": 0.004, "line_rate_bps": 200e6, "intact": True, "complete": True, "seconds": 4.0,
        "goodput_bps": 100e6, "data_packets": 100, "retransmits": 0, "timeouts": 0, "cnps": 3,
        "rate_control": "DCQCN paper", "receiver": {"nic": nic}, "senders": [{"qps": [qp], "nic": nic}],
        "flows": [{"src": "dc-host0"}], "telemetry": {}, "time_model": TM.as_dict(),
        "figures": {"ports": [{"port": "dc-leaf1:eth0", "samples": 10, "depth_p50": 5000, "depth_p90": 200_000,
                               "depth_p99": 1e6, "depth_max": 2e6, "ecn_marks": 9, "buffer_drops": 0,
                               "utilisation": 0.9}]},
        "scenario": {"intra_dc_delay_applied": False, "intra_dc_rtt_s": 3.8e-6},
        "fidelity": {"faithful": True, "findings": [{"check": "granularity", "ok": True, "message": "x", "where": ""}],
                     "machine_limits": []},
    }


def test_a_transfer_is_reported_in_the_real_fabrics_units():
    text = "\n".join(cli_text.format_transfer(_transfer()))
    assert text.splitlines()[0] == TM.line()
    assert "faithful (d = 2000)" in text
    # 4 s of wall time at d = 2000 is 2 ms; 100 Mb/s emulated at scale 1/2000 is 200 Gb/s; RTT 2 us.
    assert "intact: 2ms (4.000 s of wall time), goodput 200Gbps" in text
    assert "RTT 2us" in text and "line 400Gbps" in text
    assert "CNPs left the receiver 0.5us" in text
    # Queue bytes at s*d = 1 are the real fabric's.
    assert "dc-leaf1:eth0" in text and "5KB" in text and "200KB" in text
    assert "in-DC latency NOT APPLIED" in text and "3.8us" in text
    assert "fidelity: faithful" in text


def test_the_same_figures_at_realtime_are_a_thousand_times_the_bytes():
    body = _transfer()
    body["time_model"] = TimeModel.of(0.001, "realtime").as_dict()
    text = "\n".join(cli_text.format_transfer(body))
    assert "granularity is 1000x" in text
    assert "intact: 4s" in text and "goodput 100Gbps" in text
    assert "5MB" in text  # 5,000 emulated bytes at s*d = 0.001


def test_port_tables_convert_rates_and_depths():
    ports = [{"node": "dc-leaf1", "ifname": "eth0", "role": "leaf", "rate_bps": 200e6,
              "counters": {"tx_pkts": 1, "tx_bytes": 0, "ecn_marks": 0, "drop_buffer": 0},
              "queue": {"depth_bytes": 4154, "max_depth_bytes": 100_000}, "qdisc": {"drops": 0}}]
    line = cli_text.format_port_table(ports, TM)[1]
    assert "400Gbps" in line and "4.154KB" in line and "100KB" in line


# --- recorded bodies: `status --json` and `stats --json` of tiny.yaml up with --no-wan-delay ---

DATA = Path(__file__).resolve().parent / "data"


def _recorded(name: str) -> dict:
    return json.loads((DATA / name).read_text())


def test_status_names_every_node_link_and_the_missing_delay():
    body = _recorded("status-tiny.json")
    lines = cli_text.format_status(body)
    text = "\n".join(lines)
    assert lines[0].startswith("fabric 'rec' from ") and "MTU 4200" in lines[0]
    assert lines[1] == TimeModel.from_dict(body["time_model"]).line()
    assert "WARNING: NO WAN DELAY" in text  # said loudly, not left out
    for n in ("east-spine0", "west-leaf0", "east-border0", "west-host0", "wan1"):
        assert n in text
    # The host link's egress as the kernel holds it, in emulated and real units.
    host = next(line for line in lines if line.strip().startswith("host   east-host0:eth0"))
    assert "htb 400Mbps (real 400Gbps), buffer 16KB" in host
    assert "wan0  3000 km  400Gbps (emulated 400Mbps)" in text and "NO DELAY (configured 15ms" in text
    assert "DCQCN paper; switch ECN Kmin 5KB Kmax 200KB Pmax 0.01 (emulated 5B/200B; from profile paper)" in text
    assert "in-DC latency: 1.4us RTT real" in text and "NOT APPLIED" in text


def test_stats_rates_come_from_two_readings_in_real_units():
    now = _recorded("stats-tiny.json")
    prev = json.loads(json.dumps(now))
    prev["at"] -= 2.0  # the same ports 2 s earlier, 1 MB less sent on one of them
    port = next(p for p in prev["ports"] if (p["node"], p["ifname"]) == ("east-leaf0", "eth1"))
    port["counters"]["tx_bytes"] -= 1_000_000
    lines = cli_text.format_stats(now, prev)
    assert lines[0] == "fabric 'rec'  datapath ebpf  hash five-tuple"
    assert lines[1] == TimeModel.from_dict(now["time_model"]).line()
    row = next(line for line in lines if line.strip().startswith("east-leaf0:eth1"))
    assert "4Gbps" in row.split()  # 1 MB in 2 s is 4 Mb/s emulated: 4 Gb/s at scale 1/1000
    idle = next(line for line in lines if line.strip().startswith("west-leaf0:eth0"))
    assert idle.split()[3] == "0bps"  # nothing sent there over the interval
    assert "  east-border0 RoCE packets per long-haul path: none sent yet" in lines  # not "0:0%  1:0%"
    assert lines[-1].startswith("fidelity: ok over the last")


def test_stats_explain_a_path_at_zero_and_drops_beside_an_empty_queue():
    body = _recorded("stats-tiny.json")
    border = [p for p in body["ports"] if "wan_path" in p and p["node"] == "east-border0"]
    border[0]["counters"]["fwd_pkts"] = 10  # path 0 carried all, path 1 none
    leaf = next(p for p in body["ports"] if (p["node"], p["ifname"]) == ("east-leaf0", "eth1"))
    leaf["counters"]["drop_buffer"], leaf["queue"]["depth_bytes"] = 3, 0
    text = "\n".join(cli_text.format_stats(body))
    assert "east-border0 RoCE packets per long-haul path: 0:100%  1:0%" in text
    assert "a path at 0% carried none of them: the border hashes each packet by its UDP source port" in text
    assert "drops beside a depth of 0, as on east-leaf0:eth1, came in a burst" in text
    plain = "\n".join(cli_text.format_stats(_recorded("stats-tiny.json")))
    assert "a path at 0%" not in plain and "drops beside" not in plain  # said only when it happens


def test_stats_that_are_not_trustworthy_say_why():
    body = _recorded("stats-tiny.json")
    body["fidelity"] = {**body["fidelity"], "trustworthy": False, "limits": ["12 veth drops on east-leaf0:eth0"]}
    lines = cli_text.format_stats(body)
    assert lines[-2].startswith("fidelity: NOT TRUSTWORTHY") and lines[-1] == "  - 12 veth drops on east-leaf0:eth0"


def test_a_cross_dc_transfer_does_not_hold_its_wan_rtt_against_the_in_dc_one():
    body = _transfer()
    body["scenario"] = {**body["scenario"], "cross_dc": True}
    text = "\n".join(cli_text.format_transfer(body))
    assert "in-DC latency NOT APPLIED" in text and "the topology's in-DC RTT is 3.8us" in text
    assert "the path's RTT was" not in text


def test_pfcwd_stats_have_sonics_columns_one_queue_a_line():
    rows = [{"queue": "dc-leaf1:eth0:3", "status": "stormed", "storm_detected": 2, "storm_restored": 1,
             "tx_ok": 5, "tx_drop": 7815, "rx_ok": 0, "rx_drop": 12, "pause_ignored": 48}]
    lines = cli_text.format_pfcwd_stats(rows)
    assert lines[0].split() == ["QUEUE", "STATUS", "STORM", "DETECTED/RESTORED", "TX", "OK/DROP", "RX", "OK/DROP"]
    assert lines[1].split() == ["dc-leaf1:eth0:3", "stormed", "2/1", "5/7815", "0/12"]


def test_pfcwd_config_says_its_times_are_the_real_fabrics():
    line, = cli_text.format_pfcwd_config({"enabled": True, "action": "drop", "detection_time_s": 0.2,
                                          "restoration_time_s": 0.2, "poll_interval_s": 0.2})
    assert "started" in line and "action drop" in line and "200ms" in line.replace(" ", "") and "real" in line


def test_a_collective_is_reported_as_nccl_tests_does_in_real_and_emulated_units():
    body = _recorded("collective.json")  # `run collective ... --profile seed --json` on a fabric without delay
    lines = cli_text.format_collective(body)
    text = "\n".join(lines)
    tm = TimeModel.from_dict(body["time_model"])
    real = next(x for x in lines if x.strip().startswith("real "))
    emulated = next(x for x in lines if x.strip().startswith("emulated "))
    # Bytes / (s*d) and rates / s in the real row, the NICs' own in the emulated one.
    assert "512MB" in real and "512KB" in emulated
    assert f"{tm.real_rate(body['busbw_bps']) / 1e9:g}Gbps" in real and f"{body['busbw_bps'] / 1e6:g}Mbps" in emulated
    assert "busbw = algbw x 1.500" in text and "intact" in text and "2 of 2 run(s)" in text
    assert "ring east-host0 -> east-host1 -> west-host0 -> west-host1 -> east-host0" in text
    # A fabric without its delay lines says its distance is 0 km; the profile's gaps are said.
    assert "NO DELAY" in text and "it runs lossy" in text
    assert "NO DELAY" not in "\n".join(cli_text.format_collective({**body, "wan_delay": True}))


def test_a_training_step_says_what_share_waits_on_the_network():
    line = cli_text.format_training({"params": 7e9, "bytes_per_param": 2, "gradient_bytes": 14e9, "compute_s": 0.3,
                                     "overlap": 0.5, "comm_s": 0.2, "exposed_s": 0.1, "step_s": 0.4,
                                     "waiting_share": 0.25})
    assert "14GB of gradients" in line and "step 400ms" in line and "25.0% of it waiting" in line
