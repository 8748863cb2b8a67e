"""The topology format: shipped files, defaults, scaling and every error path."""
from pathlib import Path

import pytest
import yaml

from emulator.errors import SpecError
from emulator.model import spec

TOPOLOGIES = Path(__file__).resolve().parents[2] / "topologies"

MINIMAL = {
    "version": 1,
    "datacenters": [
        {"name": "east", "spines": 1, "leaves": 1, "hosts_per_leaf": 1},
        {"name": "west", "spines": 1, "leaves": 1, "hosts_per_leaf": 1},
    ],
    "wan": {"paths": 2, "distance": "3000km", "rate": "400Gbps"},
}


def load(doc, file="t.yaml"):
    return spec.parse(yaml.safe_dump(doc), file)


def with_(path, value, base=None):
    """A copy of MINIMAL with the value at a dotted path (ints index lists) replaced."""
    doc = yaml.safe_load(yaml.safe_dump(base or MINIMAL))
    keys = path.split(".")
    node = doc
    for k in keys[:-1]:
        node = node[int(k)] if isinstance(node, list) else node.setdefault(k, {})
    last = keys[-1]
    if isinstance(node, list):
        node[int(last)] = value
    elif value is DELETE:
        del node[last]
    else:
        node[last] = value
    return doc


DELETE = object()


@pytest.mark.parametrize("name", ["cross-dc", "single-dc", "tiny"])
def test_shipped_topologies_load(name):
    s = spec.load(TOPOLOGIES / f"{name}.yaml")
    assert s.version == 1
    assert s.mtu >= spec.ROCE_MAX_PACKET


def test_default_topology_is_the_issue_s_fabric():
    s = spec.load(TOPOLOGIES / "cross-dc.yaml")
    assert [(d.name, d.spines, d.leaves, d.hosts_per_leaf, d.borders) for d in s.datacenters] == [
        ("east", 2, 2, 2, 1), ("west", 2, 2, 2, 1)]
    assert len(s.wan_paths) == 8
    assert all(p.distance_m == 3_000_000 and p.delay_s == pytest.approx(0.015) for p in s.wan_paths)
    assert s.scale == 0.001
    assert s.emulated_rate(s.links.host) == 400_000_000


def test_single_dc_has_the_same_hosts():
    cross = spec.load(TOPOLOGIES / "cross-dc.yaml")
    single = spec.load(TOPOLOGIES / "single-dc.yaml")
    count = lambda s: sum(d.leaves * d.hosts_per_leaf for d in s.datacenters)  # noqa: E731
    assert count(single) == count(cross) == 8
    assert single.wan_paths == ()


def test_defaults():
    s = load(MINIMAL)
    assert s.scale == 0.001 and s.mtu == 4200 and s.shaper == "htb"
    assert s.links.host == s.links.fabric == s.links.border == 400_000_000_000
    assert [d.borders for d in s.datacenters] == [1, 1]
    assert s.ecmp.hash == "five-tuple" and s.nic.transport == "selective" and s.nic.dcqcn == "paper"
    assert s.pfc.enabled is False and s.pfc.watchdog.detection_time == pytest.approx(0.2)
    assert s.ecn.kmin == 5000 and s.ecn.kmax == 200_000 and s.ecn.pmax == pytest.approx(0.01)
    assert str(s.addressing.hosts) == "198.18.0.0/16"


def test_scale_applies_to_rates_and_sizes():
    s = load(with_("scale", 0.01))
    assert s.emulated_rate(s.links.fabric) == 4_000_000_000
    assert s.emulated_size(s.buffers.switch) == 160_000


def test_ber_becomes_per_packet_corruption_for_full_frames():
    s = load(with_("wan.ber", 1e-8))
    frame_bits = 8 * (4200 + 14)
    assert s.wan_paths[0].corruption == pytest.approx(1 - (1 - 1e-8) ** frame_bits)
    assert s.wan_paths[0].ber == 1e-8


def test_per_path_overrides():
    s = load(with_("wan.overrides", {1: {"loss": "1%", "distance": "100km"}}))
    assert s.wan_paths[0].loss == 0 and s.wan_paths[0].distance_m == 3_000_000
    assert s.wan_paths[1].loss == pytest.approx(0.01) and s.wan_paths[1].delay_s == pytest.approx(0.0005)


# Every error names the file, the key path and what is wrong.
ERRORS = [
    (with_("colour", "blue"), "colour", "unknown key"),
    (with_("wan.speed", "1Gbps"), "wan.speed", "unknown key"),
    (with_("datacenters.0", {"name": "east", "spines": 1, "leaves": 1, "hosts_per_leaf": 1, "racks": 2}),
     "datacenters[0].racks", "unknown key"),
    (with_("version", 2), "version", "not supported"),
    (with_("version", DELETE), "version", "is required"),
    (with_("version", "one"), "version", "must be an integer"),
    (with_("scale", 0), "scale", "must be in (0, 1]"),
    (with_("scale", "small"), "scale", "must be a number"),
    (with_("mtu", 1500), "mtu", "at least"),
    (with_("mtu", 4200.5), "mtu", "must be an integer"),
    (with_("shaper", "cbq"), "shaper", "must be one of"),
    (with_("links.host", "-400Gbps"), "links.host", "expected a rate"),
    (with_("links.host", "0Gbps"), "links.host", "must be positive"),
    (with_("links.fabric", 400), "links.fabric", "no unit"),
    (with_("buffers.switch", "1KB"), "buffers.switch", "less than one"),
    (with_("wan.rate", "1Tbps", with_("scale", 0.05)), "wan.rate", "change scale"),
    (with_("links.host", "100Mbps"), "links.host", "change scale"),
    (with_("wan.distance", "3000"), "wan.distance", "no unit"),
    (with_("wan.loss", "150%"), "wan.loss", "outside [0, 1]"),
    (with_("wan.loss", 1), "wan.loss", "for one percent write '1%'"),
    (with_("wan.overrides", {1: {"corruption": "100%"}}), "wan.overrides.1.corruption", "drop every packet"),
    (with_("ecn", {"kmin": "200KB", "kmax": "5KB"}), "ecn.kmax", "kmax 5KB (set in ecn) is below kmin 200KB"),
    (with_("wan.paths", -3), "wan.paths", "at least 1"),
    (with_("wan.paths", "eight"), "wan.paths", "must be an integer"),
    (with_("wan.ber", 1e-9, with_("wan.corruption", 0.001)), "wan.ber", "not both"),
    (with_("wan.overrides", {5: {"loss": 0.1}}), "wan.overrides.5", "0..1"),
    (with_("wan.overrides", {0: {"colour": 1}}), "wan.overrides.0.colour", "unknown key"),
    (with_("wan", DELETE), "wan", "need long-haul paths"),
    (with_("datacenters", "east"), "datacenters", "must be a list"),
    (with_("datacenters", []), "datacenters", "1 or 2"),
    (with_("datacenters", MINIMAL["datacenters"] + [dict(MINIMAL["datacenters"][0], name="north")]),
     "datacenters", "1 or 2"),
    (with_("datacenters.1", {"name": "east", "spines": 1, "leaves": 1, "hosts_per_leaf": 1}),
     "datacenters[1].name", "already the name"),
    (with_("datacenters.0", {"name": "East Coast", "spines": 1, "leaves": 1, "hosts_per_leaf": 1}),
     "datacenters[0].name", "lower-case"),
    (with_("datacenters.0", {"name": "east", "leaves": 1, "hosts_per_leaf": 1}), "datacenters[0].spines", "is required"),
    (with_("datacenters.0", {"name": "east", "spines": 1, "leaves": 1, "hosts_per_leaf": 0}),
     "datacenters[0].hosts_per_leaf", "at least 1"),
    (with_("datacenters.0", {"name": "east", "spines": 1, "leaves": 1, "hosts_per_leaf": 300}),
     "datacenters[0].hosts_per_leaf", "do not fit"),
    (with_("datacenters.0", {"name": "east", "spines": 1, "leaves": 1, "hosts_per_leaf": 1, "borders": 0}),
     "datacenters[0].borders", "at least 1 border"),
    (with_("datacenters.0", {"name": "east", "spines": 1, "leaves": 200, "hosts_per_leaf": 1},
           with_("addressing", {"hosts": "198.18.0.0/24", "host_prefix": 28})),
     "addressing.hosts", "leaf subnets"),
    (with_("addressing.links", "198.19.0.0/31", with_("datacenters.0", {"name": "east", "spines": 2, "leaves": 2, "hosts_per_leaf": 1})),
     "addressing.links", "point-to-point"),
    (with_("addressing.hosts", "198.18.0.1/16"), "addressing.hosts", "not an IPv4 prefix"),
    (with_("addressing.links", "198.18.0.0/24"), "addressing.links", "overlaps"),
    (with_("ecmp.hash", "random"), "ecmp.hash", "must be one of"),
    (with_("ecmp.datapath", "ovs"), "ecmp.datapath", "must be one of"),
    (with_("ecn.kmax", "1KB"), "ecn.kmax", "is below kmin"),
    (with_("pfc.xon", "2MB"), "pfc.xon", "must not exceed"),
    (with_("pfc.enabled", "yes please"), "pfc.enabled", "true or false"),
    (with_("pfc.watchdog", {"action": "panic"}), "pfc.watchdog.action", "must be one of"),
    (with_("nic.transport", "tcp"), "nic.transport", "must be one of"),
    (with_("nic.qps_per_pair", 0), "nic.qps_per_pair", "at least 1"),
    (with_("nic.dcqcn", "dctcp"), "nic.dcqcn", "must be one of"),
    (with_("nic.dcqcn", {"g": 0.01}), "nic.dcqcn.profile", "is required"),
    (with_("nic.dcqcn", {"profile": "nvidia", "gain": 0.01}), "nic.dcqcn.gain", "unknown key"),
    (with_("nic.dcqcn", {"profile": "nvidia", "g": 1.5}), "nic.dcqcn.g", "in (0, 1)"),
    (with_("nic.dcqcn", {"profile": "nvidia", "timer": "fast"}), "nic.dcqcn.timer", ""),
    (with_("nic.dcqcn", {"profile": "nvidia", "fast_recovery": 0}), "nic.dcqcn.fast_recovery", "at least 1"),
    (with_("nic.dcqcn", {"profile": "off", "g": 0.5}), "nic.dcqcn", "takes no fields"),
    (with_("nic.dcqcn", {"profile": "paper", "kmin": "1MB"}), "nic.dcqcn", "below kmin"),
    (with_("dilation", 0), "dilation", "must be positive"),
    (with_("dilation", -10), "dilation", "must be positive"),
    (with_("dilation", "slow"), "dilation", "realtime or faithful"),
    (with_("dilation", True), "dilation", "realtime or faithful"),
    (with_("dilation", 1001), "dilation", "largest dilation at this scale is 1/scale = 1000"),
    (with_("dilation", 200, with_("scale", 0.01)), "dilation", "more than the real fabric's"),
    (with_("dilation", 20000, with_("scale", 0.00001, with_("links", {"host": "400Tbps", "fabric": "400Tbps",
                                                                       "border": "400Tbps"},
                                                          with_("wan.rate", "400Tbps")))),
     "dilation", "more than netem holds"),
    (with_("buffers.border", "5GB", with_("dilation", "faithful")), "buffers.border", "lower the dilation"),
    (with_("latency.cable", "-1m"), "latency.cable", "expected a distance"),
    (with_("latency.switch", "fast"), "latency.switch", "expected a duration"),
    (with_("latency.hops", 3), "latency.hops", "unknown key"),
]


@pytest.mark.parametrize("doc,path,words", ERRORS, ids=[f"{e[1]}:{e[2]}" for e in ERRORS])
def test_every_error_names_file_path_and_problem(doc, path, words):
    with pytest.raises(SpecError) as info:
        load(doc, file="topologies/bad.yaml")
    err = info.value
    assert err.file == "topologies/bad.yaml"
    assert err.path == path
    assert words in err.message
    assert str(err).startswith(f"topologies/bad.yaml: {path}: ")


def test_one_dc_with_a_wan_is_refused():
    doc = with_("datacenters", [MINIMAL["datacenters"][0]])
    with pytest.raises(SpecError, match="wan: long-haul paths join two datacenters"):
        load(doc)


def test_invalid_yaml_names_the_line():
    with pytest.raises(SpecError, match=r"bad.yaml: not valid YAML: line 3"):
        spec.parse("version: 1\ndatacenters: [\n", "bad.yaml")


def test_top_level_must_be_a_mapping():
    with pytest.raises(SpecError, match=r"\(top level\): must be a mapping"):
        spec.parse("- 1\n- 2\n", "list.yaml")


def test_a_key_given_twice_is_refused_with_both_lines():
    text = ("version: 1\nscale: 0.001\ndatacenters:\n  - {name: east, spines: 1, leaves: 1, hosts_per_leaf: 2}\n"
            "  - name: west\n    spines: 1\n    leaves: 1\n    spines: 2\n")
    with pytest.raises(SpecError, match=r"dup.yaml: datacenters\[1\].spines: given twice \(lines 6 and 8\)"):
        spec.parse(text, "dup.yaml")


def test_a_binary_file_is_a_spec_error(tmp_path):
    path = tmp_path / "image.yaml"
    path.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff")
    with pytest.raises(SpecError, match="image.yaml: not a text file: byte 0x89 at offset 0"):
        spec.load(path)


def test_missing_file_is_a_spec_error(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(SpecError, match="nope.yaml: cannot read"):
        spec.load(missing)


def test_spec_is_frozen():
    s = load(MINIMAL)
    with pytest.raises(AttributeError):
        s.scale = 1.0


def test_dcqcn_profile_fields_are_overridden_one_by_one():
    s = load(with_("nic.dcqcn", {"profile": "nvidia", "g": 0.25, "timer": "55us", "byte_counter": 0,
                                  "rate_ai": "40Mbps", "min_rate": "10Mbps"}))
    p = s.nic.dcqcn_profile(s.links.host)
    assert s.nic.dcqcn == "nvidia"
    assert (p.g, p.timer_s, p.byte_counter) == (0.25, pytest.approx(55e-6), 0)
    assert (p.rate_ai_bps, p.min_rate_bps) == (40e6, 10e6)
    # untouched fields keep the profile's values
    assert p.fast_recovery == 1 and p.rate_hai_bps == 50e6 and p.alpha_period_s == pytest.approx(1e-6)


def test_bare_off_is_the_off_profile():
    # YAML reads `dcqcn: off` as false
    s = spec.parse("version: 1\ndatacenters: [{name: east, spines: 1, leaves: 1, hosts_per_leaf: 2}]\n"
                   "nic: {dcqcn: off}\n")
    assert s.nic.dcqcn == "off" and not s.nic.dcqcn_profile(s.links.host).enabled


def test_ecn_thresholds_come_from_the_topology_then_the_profile_then_the_paper():
    doc = with_("nic.dcqcn", "hpcc-ns3", {k: v for k, v in MINIMAL.items() if k != "ecn"})
    s = load(doc)
    # hpcc-ns3: 100 KB and 400 KB per 25 Gb/s of host link (400 Gb/s here), Pmax 20%
    assert (s.ecn.kmin, s.ecn.kmax, s.ecn.pmax) == (1_600_000, 6_400_000, pytest.approx(0.2))
    assert s.ecn.source == ("profile hpcc-ns3",) * 3
    s = load(with_("ecn", {"kmax": "8MB"}, doc))
    assert (s.ecn.kmin, s.ecn.kmax) == (1_600_000, 8_000_000)
    assert s.ecn.source == ("profile hpcc-ns3", "ecn", "profile hpcc-ns3")
    s = load(with_("nic.dcqcn", "nvidia", doc))  # nvidia leaves the thresholds to the switch
    assert (s.ecn.kmin, s.ecn.kmax, s.ecn.pmax, s.ecn.source) == (5000, 200_000, pytest.approx(0.01), ("default",) * 3)


def test_a_given_kmin_is_checked_against_the_profiles_kmax_not_the_default():
    # 1 MB is above the paper's 200 KB default but below hpcc-ns3's 6.4 MB at 400 Gb/s
    s = load(with_("ecn", {"kmin": "1MB"}, with_("nic.dcqcn", "hpcc-ns3")))
    assert (s.ecn.kmin, s.ecn.kmax) == (1_000_000, 6_400_000)


# --- the time model: rates x scale, times x dilation, bytes x scale*dilation ---


def test_realtime_is_the_default_and_faithful_runs_real_bytes():
    s = load(MINIMAL)
    assert (s.dilation, s.dilation_preset) == (1.0, "realtime")
    assert s.emulated_size(s.buffers.switch) == 16_000
    f = load(with_("dilation", "faithful"))
    assert (f.dilation, f.dilation_preset) == (1000.0, "faithful")
    assert f.time.distortion == pytest.approx(1.0)
    # Rates scale alone; times dilate; bytes are the real fabric's.
    assert f.emulated_rate(f.links.host) == 400_000_000
    assert f.emulated_time(f.wan_paths[0].delay_s) == pytest.approx(15.0)
    assert f.emulated_size(f.buffers.switch) == 16_000_000
    assert f.emulated_ecn() == (5_000, 200_000, 0.01)


def test_a_dilation_in_between_scales_bytes_by_both():
    s = load(with_("dilation", 10))
    assert (s.dilation, s.dilation_preset) == (10.0, None)
    assert s.emulated_size(s.buffers.switch) == 160_000  # 16 MB x 0.001 x 10
    assert s.emulated_time(0.015) == pytest.approx(0.15)
    assert s.time.distortion == pytest.approx(100)


def test_up_dilation_replaces_the_files_and_is_checked_like_it():
    s = load(MINIMAL)
    f = spec.with_dilation(s, spec.parse_dilation("faithful"))
    assert f.dilation == 1000 and f.emulated_size(f.buffers.host) == 16_000_000
    assert spec.with_dilation(s, spec.parse_dilation("10")).dilation == 10
    with pytest.raises(SpecError) as info:
        spec.with_dilation(s, spec.parse_dilation("2000"))
    assert info.value.path == "--dilation" and "1/scale = 1000" in str(info.value)
    with pytest.raises(SpecError) as info:
        spec.with_dilation(s, spec.parse_dilation("fast"))
    assert info.value.path == "--dilation"


def test_in_dc_latency_is_cables_and_switches_across_a_spine():
    one_leaf = [{"name": "east", "spines": 1, "leaves": 1, "hosts_per_leaf": 2}]
    # 4 cables of 500 ns, and leaf, spine, leaf
    two = load(with_("latency", {"cable": "100m", "switch": "1us"},
                     {"version": 1, "datacenters": [{"name": "east", "spines": 1, "leaves": 2, "hosts_per_leaf": 1}]}))
    assert two.intra_dc_one_way_s() == pytest.approx(4 * 500e-9 + 3 * 1e-6)
    rack = load({"version": 1, "datacenters": one_leaf, "latency": {"cable": "100m", "switch": "1us"}})
    assert rack.intra_dc_one_way_s() == pytest.approx(2 * 500e-9 + 1e-6)
