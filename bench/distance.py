"""The headline experiment: what do 3,000 km cost an all-reduce and a training step?

The same 8 hosts, in one DC (topologies/single-dc.yaml) and split over two DCs 3,000 km apart
(topologies/cross-dc.yaml, the ring crossing the long-haul paths twice), run a ring all-reduce
through the soft-NICs for each message size (the real fabric's bytes), job profile and long-haul
loss; it prints each time in the real fabric's units, the cross-DC / single-DC ratio, the same
ratio from the alpha-beta model (2(n-1)/n x S/B + 2(n-1) x alpha, alpha from the RTTs measured on
each ring hop), and the step-time ratio for a step of ``--compute`` with ``--overlap`` of the
all-reduce hidden under it. Loss matters through packets in flight x p: the table gives N*p.

The scale must fit the CPU, or the soft-NICs, not the links, set the bandwidth term and the
ratio says nothing about distance: in a QEMU guest without KVM (about 20x slower) the fabrics
run at scale 5e-6 (400 Gb/s is 2 Mb/s) and dilation 200 (bytes x 1e-3 as at the default scale;
15 ms take 3 s), elsewhere at the topologies' own. Every run's single-DC all-reduce of the
largest size must reach 0.8 of the line rate in busbw; the table says CPU-BOUND where it did not.

The 15 ms fibers need sch_netem: on a kernel without it, run it in the delay tier's VM:
    sudo .venv/bin/backplane vm run -- bash -c '"$BACKPLANE_VENV"/bin/python bench/distance.py --quick'
    sudo .venv/bin/python bench/distance.py [--sizes 1MB,32MB,1GB] [--profiles meta,seed,baseline]
                                            [--losses 0,1e-6,1e-4] [--compute 100ms] [--overlap 0.5]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from emulator.cli import jobs  # noqa: E402
from emulator.control import client  # noqa: E402
from emulator.fabric import capabilities, netns  # noqa: E402
from emulator.model import plan as plan_mod  # noqa: E402
from emulator.model import units  # noqa: E402
from emulator.model.timemodel import TimeModel  # noqa: E402
from emulator.nic import wire  # noqa: E402
from emulator.workload import collectives as C, interop  # noqa: E402
from emulator.workload.worker import MTU_PAYLOAD  # noqa: E402

SINGLE = ("single-dc", [f"local-host{i}" for i in range(8)])
CROSS = ("cross-dc", [f"east-host{i}" for i in range(4)] + [f"west-host{i}" for i in range(4)])
PATHS = 8  # the cross-DC topology's long-haul paths
# What a QEMU guest without KVM keeps up with: 8 soft-NICs at 2 Mb/s each (measured: a 4-rank
# all-reduce at 0.98 of the line in busbw), bytes x s*d = 1e-3 as at the default scale.
TCG_SCALE, TCG_DILATION = "5e-6", "200"
FIT = 0.8  # the single-DC all-reduce's busbw / line rate below which the run was CPU-bound
FREE = 1.1  # a cross-DC step at most this many times a single-DC one counts as "nearly free"
FLOOR = 3.0  # measured / model time above which a single-DC all-reduce is the emulator's floor


def bp(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "emulator.cli", *args], cwd=REPO, capture_output=True, text=True)
    if check and done.returncode != 0:
        raise SystemExit(f"backplane {' '.join(args)} exited {done.returncode}: {done.stderr.strip()}")
    return done


def allreduce(name: str, hosts: list[str], size: int, profile: str, iters: int, channels: int,
              rtts: dict | None = None) -> dict:
    """``run collective all-reduce --json``'s record, run in this process (a CLI's start costs
    seconds in a QEMU guest without KVM; the bench runs dozens); ``rtts``: the ring's hops' RTTs
    from an earlier case on the same fabric, filled in by the first."""
    return json.loads(json.dumps(jobs.collective_job(name, "all_reduce", hosts, size, channels, profile=profile,
                                                     iters=iters, rtts=rtts)))


def time_model(name: str) -> TimeModel:
    return client.running(name).plan.spec.time


def frame_loss(loss: float, tm: TimeModel) -> float:
    """The loss per emulated frame that loses as many of the real fabric's packets per byte as
    ``loss`` per real packet: a frame carries 1/(s*d) real frames' bytes (DESIGN.md: frames do not
    scale), so it is lost when any of them would be, and N*p per byte stays the real fabric's."""
    return 1.0 - (1.0 - loss) ** tm.distortion


def set_loss(name: str, paths: int, loss: float) -> None:
    """``inject ber wanI --loss P`` on every long-haul path (P per emulated frame)."""
    for i in range(paths):
        client.request(name, {"op": "inject", "kind": "ber", "target": f"wan{i}", "detection_s": None,
                              "ber": None, "corruption": None, "loss": loss})


def measure(topology: str, hosts: list[str], sizes: list[int], profiles: list[str], losses: list[float],
            iters: int, channels: int, time_args: list[str], pcap: Path | None = None, keep=None) -> list[dict]:
    """Bring ``topology`` up, run every case on ``hosts``, tear it down."""
    name = f"dist{topology[0]}"
    bp("up", str(REPO / "topologies" / f"{topology}.yaml"), "--name", name, *time_args)
    try:
        return run_cases(name, topology, hosts, sizes, profiles, losses, iters, channels, pcap, keep)
    finally:
        bp("down", "-n", name, check=False)


def run_cases(name: str, label: str, hosts: list[str], sizes: list[int], profiles: list[str], losses: list[float],
              iters: int, channels: int, pcap: Path | None = None, keep=None) -> list[dict]:
    """An all-reduce on ``hosts`` of fabric ``name`` for each loss, profile and size; rows labelled
    ``label``. Loss goes on every long-haul path, so only a ring that crosses them gets it. With
    ``pcap``, the first profile's largest all-reduce is captured on the first rank's NIC.
    ``keep(row)`` is called with each row as soon as it is measured."""
    tm = time_model(name)
    paths = PATHS if label == "cross-dc" else 0
    rows = []
    # The ring's hops are pinged once, by the first case (before any loss, with the first loss 0):
    # a dilated cross-DC ping takes seconds, and the propagation it measures is every case's.
    rtts: dict = {}
    for loss in losses if paths else [0.0]:
        frame = frame_loss(loss, tm)
        if loss:
            set_loss(name, paths, frame)
        for profile in profiles:
            for real in sizes:
                capture = pcap is not None and profile == profiles[0] and real == max(sizes) and loss == 0
                with (interop.capture(nic(name, hosts[0]), pcap, plan_mod.prefix_of(name) + hosts[0]) if capture
                      else contextlib.nullcontext()):
                    began = time.monotonic()
                    r = allreduce(name, hosts, tm.size(real), profile, iters, channels, rtts)
                    took = time.monotonic() - began
                rows.append({"topology": label, "loss": loss, "loss_frame": frame, "profile": profile,
                             "real_size": real, **r})
                if keep is not None:
                    keep(rows[-1])
                print(f"  {label:<9} loss {loss:<6g} (per frame {frame:<6.2g}) {profile:<8} {units.format_size(real):>7}: "
                      f"{units.format_duration(tm.real_time(r['time_s'])):>10} "
                      f"({'intact' if r['intact'] else 'NOT INTACT'}, {r['retransmits']} resent; {took:.0f} s of wall time with "
                      f"the ranks' start)", flush=True)
        if loss:
            client.request(name, {"op": "inject", "kind": "restore", "target": "all", "detection_s": None})
    return rows


def nic(name: str, host: str) -> str:
    """The host's one fabric-facing interface."""
    with netns.iproute(plan_mod.prefix_of(name) + host) as ipr:
        names = [link.get_attr("IFLA_IFNAME") for link in ipr.get_links()]
    found = [n for n in names if n != "lo"]
    if len(found) != 1:
        raise SystemExit(f"{host} of fabric {name!r} has interfaces {names}: expected one besides lo")
    return found[0]


def check_pcap(path: Path) -> int:
    """RoCEv2 packets in the capture, each parsed by scapy down to its BTH (what Wireshark shows)."""
    from scapy.contrib.roce import BTH
    from scapy.layers.inet import UDP
    from scapy.utils import rdpcap
    pkts = [p for p in rdpcap(str(path)) if UDP in p and p[UDP].dport == wire.ROCE_PORT]
    if not pkts or not all(BTH in p for p in pkts):
        raise SystemExit(f"{path}: {len(pkts)} RoCEv2 packets, not every one with a BTH")
    return len(pkts)


def plot(rows: list[dict], path: Path) -> None:
    """Real time of each all-reduce, one DC beside two, with the alpha-beta model's as markers."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    single = {(r["profile"], r["real_size"]): r for r in rows if r["topology"] == "single-dc" and r["loss"] == 0}
    cross = {(r["profile"], r["real_size"]): r for r in rows if r["topology"] == "cross-dc" and r["loss"] == 0}
    keys = [k for k in single if k in cross]
    fig, ax = plt.subplots(figsize=(max(6, 1.4 * len(keys)), 4.5))
    for i, key in enumerate(keys):
        for dx, r, colour, label in ((-0.2, single[key], "tab:blue", "one DC"),
                                     (0.2, cross[key], "tab:red", "two DCs, 3,000 km")):
            tm = TimeModel.from_dict(r["time_model"])
            ax.bar(i + dx, tm.real_time(r["time_s"]) * 1e3, 0.38, color=colour, label=label if i == 0 else None)
            ax.plot(i + dx, tm.real_time(r["model_s"]) * 1e3, "k_", markersize=22,
                    label="alpha-beta model" if i == 0 and dx > 0 else None)
    ax.set_xticks(range(len(keys)), [f"{p}\n{units.format_size(s)}" for p, s in keys])
    ax.set_yscale("log")
    ax.set_ylabel("all-reduce time, real fabric (ms)")
    n = len(rows[0]["hosts"]) if rows else 0
    ax.set_title(f"Ring all-reduce over {n} ranks:\none DC against two DCs 3,000 km apart")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def demo_hosts(ranks: int) -> tuple[list[str], list[str]]:
    """On the cross-DC fabric: ``ranks`` hosts in the east DC, and half of them east, half west."""
    if ranks < 2 or ranks % 2 or ranks > 4:
        raise SystemExit(f"--ranks {ranks}: give an even number from 2 to 4 (the cross-DC fabric has 4 hosts a DC)")
    east = [f"east-host{i}" for i in range(ranks)]
    return east, east[:ranks // 2] + [f"west-host{i}" for i in range(ranks // 2)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1MB,32MB,1GB", help="real message sizes")
    ap.add_argument("--profiles", default="meta,seed,baseline")
    ap.add_argument("--losses", default="0,1e-6,1e-4", help="per-packet loss on every long-haul path")
    ap.add_argument("--compute", default="100ms", help="a training step's compute, real time")
    ap.add_argument("--overlap", type=float, default=0.5, help="share of the all-reduce under the compute")
    ap.add_argument("--iters", type=int, default=2)
    ap.add_argument("--channels", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="1MB and 1GB, meta and seed, no loss")
    ap.add_argument("--json", default=None, help="write every row here, each as soon as it is measured")
    ap.add_argument("--out", default=None, help="write distance.png and a pcap of a cross-DC all-reduce here")
    ap.add_argument("--fabric", default=None, help="a cross-DC fabric already up: run one DC's hosts against "
                                                   "both DCs' on it instead of bringing up the two topologies")
    ap.add_argument("--ranks", type=int, default=4, help="with --fabric: ranks per all-reduce")
    ap.add_argument("--scale", default=None, help="up --scale [default: 5e-6 in a QEMU guest without KVM, "
                                                  "else the topologies']")
    ap.add_argument("--dilation", default=None, help="up --dilation [default: 200 with that scale]")
    ap.add_argument("--table", default=None, metavar="JSON[,JSON]", help="print the table of rows saved with --json "
                                                                       "(from one run or several)")
    ap.add_argument("--topologies", default="single-dc,cross-dc", help="which of the two to run")
    a = ap.parse_args()
    if a.table:
        rows = [r for f in a.table.split(",") for r in json.loads(Path(f).read_text())]
        print(table(rows, units.parse_duration(a.compute), a.overlap))
        return 0
    if a.scale is None and os.environ.get("BACKPLANE_VM_ACCEL") == "tcg":
        a.scale, a.dilation = TCG_SCALE, a.dilation or TCG_DILATION
    time_args = (["--scale", a.scale] if a.scale else []) + (["--dilation", a.dilation] if a.dilation else [])
    if a.quick:
        a.sizes, a.profiles, a.losses = "1MB,1GB", "meta,seed", "0"
    if not capabilities.has_netem():
        print("error: this kernel has no sch_netem, so the 3,000 km cannot be emulated here; run it in the delay "
              "tier's VM: sudo .venv/bin/backplane vm run -- bash -c '\"$BACKPLANE_VENV\"/bin/python "
              "bench/distance.py'", file=sys.stderr)
        return 3
    sizes = [units.parse_size(s) for s in a.sizes.split(",")]
    profiles = a.profiles.split(",")
    losses = [float(x) for x in a.losses.split(",")]
    compute = units.parse_duration(a.compute)
    out = Path(a.out) if a.out else None
    pcap = out / "allreduce-cross-dc.pcap" if out else None
    if out:
        out.mkdir(parents=True, exist_ok=True)
    kept: list[dict] = []

    def keep(row: dict) -> None:  # a long run stopped part way keeps what it measured
        kept.append(row)
        if a.json:
            Path(a.json).write_text(json.dumps(kept, indent=2))

    if a.fabric:
        one, two = demo_hosts(a.ranks)
        rows = run_cases(a.fabric, "single-dc", one, sizes, profiles, [0.0], a.iters, a.channels, keep=keep) + \
            run_cases(a.fabric, "cross-dc", two, sizes, profiles, losses, a.iters, a.channels, pcap, keep)
    else:
        which = a.topologies.split(",")
        rows = (measure(*SINGLE, sizes, profiles, [0.0], a.iters, a.channels, time_args, keep=keep)
                if "single-dc" in which else []) + \
            (measure(*CROSS, sizes, profiles, losses, a.iters, a.channels, time_args, pcap, keep)
             if "cross-dc" in which else [])
    print(table(rows, compute, a.overlap))
    if out:
        plot(rows, out / "distance.png")
        print(f"wrote {out / 'distance.png'} (each all-reduce's real time, one DC beside two, the model as bars' "
              f"marks) and {pcap} ({check_pcap(pcap)} RoCEv2 packets of the first profile's largest cross-DC "
              f"all-reduce on {rows[-1]['hosts'][0]}'s NIC; Wireshark decodes them as InfiniBand over UDP 4791)")
    return 0


def fit(rows: list[dict]) -> list[str]:
    """The single-DC runs whose bandwidth the CPU, not the links, set: a sentence each."""
    out = []
    largest = max((r["real_size"] for r in rows), default=0)
    for r in rows:
        if r["topology"] == "single-dc" and r["real_size"] == largest and r["busbw_bps"] < FIT * r["line_rate_bps"]:
            out.append(f"CPU-BOUND: single-DC {r['profile']} {units.format_size(largest)} reached "
                       f"{r['busbw_bps'] / r['line_rate_bps']:.2f} of the line in busbw (< {FIT}): the soft-NICs, not "
                       "the links, set its bandwidth term, so its ratios overstate how free the distance is; lower "
                       "--scale")
    for r in rows:
        tm = TimeModel.from_dict(r["time_model"])
        measured, model = tm.real_time(r["time_s"]), tm.real_time(r["model_s"])
        if r["topology"] == "single-dc" and model > 0 and measured > FLOOR * model:
            steps = 2 * (len(r["hosts"]) - 1)
            out.append(f"FLOOR: single-DC {r['profile']} {units.format_size(r['real_size'])} took "
                       f"{units.format_duration(measured)}, {measured / model:.0f}x the model's "
                       f"{units.format_duration(model)}: each of its {steps} ring steps cost the soft-NICs' own work "
                       f"(about {units.format_duration(measured / steps)} a step at dilation {tm.dilation:g}) more "
                       "than the fabric's, so its measured ratio understates what the distance costs and the "
                       "model's is the real fabric's; a larger --dilation shrinks that floor as many times")
    return out


def path_model(r: dict) -> float:
    """The ring-path model's time (wall) of row ``r`` (collectives.ring_path), from its hops' RTTs."""
    if r.get("path_model_s"):
        return r["path_model_s"]
    return C.ring_path("all_reduce", [x / 2 for x in r["hop_rtts_s"].values()], r["line_rate_bps"], r["size"])


def crossing_hops(hosts: list[str]) -> list[int]:
    """1 for each ring hop (rank i to i + 1) from one DC to the other (a host's DC is its name's prefix)."""
    dc = [h.split("-")[0] for h in hosts]
    return [int(dc[i] != dc[(i + 1) % len(dc)]) for i in range(len(dc))]


def break_even(single_s: float, cross_s: float, overlap: float) -> float:
    """The least compute (seconds) at which a step with the cross-DC all-reduce takes at most FREE
    times one with the single-DC all-reduce: the step ratio only falls as compute grows."""
    ratio = lambda t: C.step(t, cross_s, overlap).step_s / max(1e-12, C.step(t, single_s, overlap).step_s)  # noqa
    if ratio(0.0) <= FREE:
        return 0.0
    lo, hi = 0.0, 1.0
    while ratio(hi) > FREE:
        lo, hi = hi, hi * 2
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if ratio(mid) <= FREE else (mid, hi)
    return hi


def latency_sentence(rows: list[dict]) -> str:
    """What the alpha-beta model says the distance costs and how large an all-reduce must be to
    hide it: cross <= FREE x single when 2(n-1)/n x S/B >= 2(n-1)(a_c - FREE a_s) / (FREE - 1),
    that is S >= n B (a_c - FREE a_s) / (FREE - 1)."""
    cross = [r for r in rows if r["topology"] == "cross-dc"]
    single = [r for r in rows if r["topology"] == "single-dc"]
    if not cross or not single:
        return "the distance's cost needs both topologies' runs"
    c, s = cross[0], single[0]
    tm = TimeModel.from_dict(c["time_model"])
    n = len(c["hosts"])
    a_c, a_s = tm.real_time(c["alpha_s"]), tm.real_time(s["alpha_s"])
    rate = tm.real_rate(c["line_rate_bps"])
    need = n * rate / 8 * (a_c - FREE * a_s) / (FREE - 1)
    ring = crossing_hops(c["hosts"])
    k = max(sum(ring[(i + j) % n] for j in range(2 * (n - 1))) for i in range(n))
    return (f"By the alpha-beta model the distance costs a ring all-reduce over {n} ranks {2 * (n - 1)} steps "
            f"of alpha = {units.format_duration(a_c)} (against {units.format_duration(a_s)} in one DC), "
            f"{units.format_duration(2 * (n - 1) * a_c)} whatever its size, and the all-reduce alone is within "
            f"{FREE - 1:.0%} of one DC's only from {units.format_size(need)} at {units.format_rate(rate)} a link; "
            f"a ring whose ranks go on as their data comes pays only the {k} crossings on a chunk's way "
            f"({units.format_duration(k * a_c)}: the ring-path model), and a clear-to-send window that makes "
            "every step wait for a grant from across the WAN pays all of them. Either way the distance is nearly "
            "free only where compute hides it (the free-when lines)")


def table(rows: list[dict], compute_s: float, overlap: float) -> str:
    single = {(r["profile"], r["real_size"]): r for r in rows if r["topology"] == "single-dc"}
    out = [f"{'profile':<9} {'size':>7} {'loss':>6} {'N*p':>7} {'emul':>7} {'single':>9} {'cross':>9} {'ratio':>6} "
           f"{'model':>7} {'path':>6} {'step':>5} {'model':>5} {'path':>5}",
           f"  (real time; ratio: cross / single all-reduce, measured, by the alpha-beta model (every step "
           f"pays the longest hop) and by the ring-path model (a chunk pays only the hops it crosses); step: "
           f"cross / single training step, compute {units.format_duration(compute_s)}, {overlap:.0%} of the "
           "all-reduce under it, measured and by the two models; N*p: packets a ring step sends across the long "
           "haul x loss, in the real fabric and as emulated (a frame holds 1/(s*d) real packets' bytes, so the "
           "bench loses 1-(1-p)^(1/(s*d)) of frames))"]
    steps, failed = [], []
    for r in (x for x in rows if x["topology"] == "cross-dc" and (x["profile"], x["real_size"]) in single):
        s = single[(r["profile"], r["real_size"])]
        tm = TimeModel.from_dict(r["time_model"])
        t_s, t_c = tm.real_time(s["time_s"]), tm.real_time(r["time_s"])
        ratio = t_c / t_s if t_s > 0 else float("inf")
        m_s, m_c = tm.real_time(s["model_s"]), tm.real_time(r["model_s"])
        p_s, p_c = tm.real_time(path_model(s)), tm.real_time(path_model(r))
        st = lambda c, x: C.step(compute_s, c, overlap).step_s / C.step(compute_s, x, overlap).step_s  # noqa
        n, cross = len(r["hosts"]), sum(crossing_hops(r["hosts"]))
        # A ring step: each crossing hop carries one rank's part (real packets of MTU_PAYLOAD, or frames).
        real_pkts = cross * math.ceil(r["real_size"] / n / MTU_PAYLOAD)
        frames = cross * r["data_packets"] / max(1, r["iters"]) / (2 * (n - 1)) / n
        out.append(f"{r['profile']:<9} {units.format_size(r['real_size']):>7} {r['loss']:>6g} "
                   f"{real_pkts * r['loss']:>7.2g} {frames * r.get('loss_frame', r['loss']):>7.2g} "
                   f"{units.format_duration(t_s):>9} {units.format_duration(t_c):>9} {ratio:>6.2f} "
                   f"{m_c / m_s:>7.2f} {p_c / p_s:>6.2f} {st(t_c, t_s):>5.2f} {st(m_c, m_s):>5.2f} "
                   f"{st(p_c, p_s):>5.2f}" + ("" if r["intact"] and s["intact"] else "  NOT INTACT"))
        if r["intact"] and s["intact"]:  # intact: complete, and every rank's result right
            steps.append((st(t_c, t_s), r))  # a run that failed has no time to answer with
        else:
            failed.append(r)
    out += fit(rows)
    for r, s in ((r, single[(r["profile"], r["real_size"])]) for r in rows
                 if r["topology"] == "cross-dc" and r["loss"] == 0 and (r["profile"], r["real_size"]) in single):
        tm = TimeModel.from_dict(r["time_model"])
        at = [units.format_duration(break_even(tm.real_time(s[k]), tm.real_time(r[k]), overlap)) for k in
              ("time_s", "model_s")]
        out.append(f"free when: {r['profile']} {units.format_size(r['real_size'])} costs a step at most "
                   f"{FREE - 1:.0%} more across 3,000 km once its compute is at least {at[0]} (measured; "
                   f"{at[1]} by the model) with {overlap:.0%} of the all-reduce under it")
    if steps or failed:
        free = [(x, r) for x, r in steps if x <= FREE]
        dear = [(x, r) for x, r in steps if x > FREE]
        case = lambda r: f"{r['profile']} {units.format_size(r['real_size'])} loss {r['loss']:g}"  # noqa
        say = lambda xs: ", ".join(f"{case(r)} x{x:.2f}" for x, r in xs) or "none"  # noqa
        gone = f"; did not complete intact (no figure): {', '.join(map(case, failed))}" if failed else ""
        out.append(f"answer: across 3,000 km a training step (compute {units.format_duration(compute_s)}, "
                   f"{overlap:.0%} overlap) takes at most {FREE - 1:.0%} longer for: {say(free)}; longer for: "
                   f"{say(dear)}{gone}. {latency_sentence(rows)}; loss adds recovery across the WAN in proportion "
                   "to packets in flight x loss (N*p): near 0 it costs nothing, near 1 every step waits a WAN "
                   "round trip more")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
