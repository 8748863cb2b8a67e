"""The text the CLI prints for a fabric's status, its port figures and a transfer's report: pure
functions of the JSON bodies the core returns (recorded ones in tests/unit/test_cli_text.py),
every figure in the real fabric's units through the body's time model."""
from __future__ import annotations

from emulator.model import units
from emulator.model.timemodel import TimeModel


def egress_text(e: dict) -> str:
    k = e.get("kernel", {})
    if (e.get("configured") or {}).get("kind") == "none":
        return f"NO DELAY LINE ({k.get('kind')}; --no-wan-delay)"
    if k.get("kind") in ("htb", "tbf"):
        conf = e.get("configured", {})
        limit = k.get("limit_bytes", 0)
        buffer = (f"buffer {units.format_size(conf['buffer_bytes'])} (eBPF tail drop; qdisc limit "
                  f"{units.format_size(limit)})" if conf.get("buffer_bytes") not in (None, limit)
                  else f"buffer {units.format_size(limit)}")
        return (f"{k['kind']} {units.format_rate(k['rate_bps'])} (real {units.format_rate(conf.get('real_rate_bps'))}), "
                f"{buffer}")
    if k.get("kind") == "netem":
        return (f"netem {units.format_duration(k['delay_s'])} loss {k['loss']:.3g} "
                f"corrupt {k['corruption']:.3g} limit {k['limit_packets']}p")
    return k.get("kind", "?")


def format_status(body: dict) -> list[str]:
    tm = time_model(body)
    lines = [f"fabric {body['name']!r} from {body['topology']}  MTU {body['mtu']}  controller pid {body['controller_pid']}",
             tm.line()]
    for w in body["warnings"]:
        lines.append(f"WARNING: {w}")
    roles: dict[str, list[str]] = {}
    for n in body["nodes"]:
        roles.setdefault(n["role"], []).append(n["name"])
    lines.append("nodes:")
    for role, names in roles.items():
        plural = {"leaf": "leaves"}.get(role, role + "s")
        lines.append(f"  {plural:<8} {' '.join(names)}")
    lines.append("links (egress as installed in the kernel):")
    for link in body["links"]:
        a, b = link["a"], link["b"]
        head = f"  {link['kind']:<6} {a['node']}:{a['ifname']} <-> {b['node']}:{b['ifname']}"
        lines.append(f"{head:<48} -> {egress_text(a)} | <- {egress_text(b)}")
    if body["wan_paths"]:
        lines.append("long-haul paths:")
    for p in body["wan_paths"]:
        delay = (f"{units.format_duration(p['one_way_delay_s'])} one way" if p["delay_emulated"]
                 else f"NO DELAY (configured {units.format_duration(p['configured_one_way_delay_s'])}; --no-wan-delay)")
        if p["delay_emulated"] and tm.dilation != 1:
            delay += f" ({units.format_duration(p['wall_one_way_delay_s'])} of wall time)"
        lines.append(f"  {p['fiber']:<5} {p['distance_m'] / 1e3:g} km  {units.format_rate(p['real_rate_bps'])} "
                     f"(emulated {units.format_rate(p['rate_bps'])})  loss {p['loss']:.3g}"
                     f"{' (eBPF)' if p.get('loss_by') == 'ebpf' else ''}  "
                     f"corruption {p['corruption']:.3g}  {delay}")
    cc = body.get("congestion")
    if cc:
        e = cc["ecn"]
        over = ", ".join(f"{k}={v:g}" for k, v in cc["dcqcn_overrides"].items())
        src = e["source"]
        origin = src["kmin"] if len(set(src.values())) == 1 else ", ".join(f"{k} {v}" for k, v in src.items())
        lines.append(f"congestion control: DCQCN {cc['dcqcn']}{f' ({over})' if over else ''}; switch ECN "
                     f"Kmin {units.format_size(e['kmin'])} Kmax {units.format_size(e['kmax'])} Pmax {e['pmax']:.3g} "
                     f"(emulated {units.format_size(e['emulated_kmin'])}/{units.format_size(e['emulated_kmax'])}; "
                     f"from {origin})")
    pfc = body.get("pfc") or {}
    if pfc.get("enabled"):
        rooms = ", ".join(f"{k} {units.format_size(h['reserved'])} (frames {units.format_size(h['frames'])}, cable "
                          f"{units.format_size(h['cable'])}, reaction {units.format_size(h['response'])} in "
                          f"{units.format_duration(h['response_s'])})" for k, h in pfc["headroom"].items())
        lines.append(f"PFC on priority {pfc['priority']}: XOFF {units.format_size(pfc['xoff'])} XON "
                     f"{units.format_size(pfc['xon'])}; headroom per port {rooms}; long-haul ports lossy")
        agent = pfc.get("agent")
        if agent and agent["reactions"]:
            lines.append(f"  pause reaction measured (wall): p50 {units.format_duration(agent['reaction_p50_s'])} "
                         f"p99 {units.format_duration(agent['reaction_p99_s'])} max "
                         f"{units.format_duration(agent['reaction_max_s'])} over {agent['reactions']} pauses; the "
                         f"headroom assumes {units.format_duration(pfc['assumed_reaction_s'])}")
    intra = body.get("intra_dc")
    if intra:
        applied = (f"held by netem on each host's egress ({units.format_duration(intra['wall_one_way_s'])} of wall "
                   "time each way)" if intra["applied"] else
                   f"NOT APPLIED ({intra['not_applied_because']}): the RTTs below are what the emulator itself gives")
        lines.append(f"in-DC latency: {units.format_duration(intra['rtt_s'])} RTT real ({intra['cable_m']:g} m cables, "
                     f"{units.format_duration(intra['switch_s'])} per switch); {applied}")
    if body["rtt"]:
        lines.append("RTT measured now:")
    for r in body["rtt"]:
        if "error" in r:
            lines.append(f"  {r['scope']:<10} {r['src']} -> {r['dst']}: FAILED: {r['error']}")
            continue
        note = "" if body["wan_delay"] or r["scope"] != "cross-dc" else "  (NO WAN DELAY: not the real distance)"
        real = lambda wall_s: units.format_duration(tm.real_time(wall_s))  # noqa: E731
        wall = (f" [wall: avg {units.format_duration(r['avg_s'])} min {units.format_duration(r['min_s'])}]"
                if tm.dilation != 1 else "")
        lines.append(f"  {r['scope']:<10} {r['src']} -> {r['dst']} ({r['dst_address']}): "
                     f"avg {real(r['avg_s'])} min {real(r['min_s'])} max {real(r['max_s'])} "
                     f"({r['received']}/{r['sent']} replies); expected "
                     f"{real(r['expected_s']) if r['expected_s'] else '~0'} propagation{note}{wall}")
    return lines


def time_model(body: dict) -> TimeModel:
    return TimeModel.from_dict(body["time_model"])


def format_transfer(body: dict) -> list[str]:
    """The transfer in the real fabric's units: times / d, rates / s, bytes / (s*d)."""
    r = body
    tm = time_model(r)
    line = r["line_rate_bps"]
    dur = lambda wall_s: units.format_duration(tm.real_time(wall_s))  # noqa: E731
    rate = lambda bps: units.format_rate(tm.real_rate(bps))  # noqa: E731
    size = lambda nbytes: units.format_size(tm.real_size(nbytes))  # noqa: E731
    lines = [tm.line(),
             f"{r['src']} -> {r['dst']}: {size(r['size'])} per sender ({units.format_size(r['size'])} emulated) over "
             f"{r['qps']} QPs each, {r['transport']}, RTT {dur(r['rtt_s'])}, line {rate(line)}",
             f"  {'intact' if r['intact'] else 'NOT INTACT'}{'' if r['complete'] else ', INCOMPLETE'}: "
             f"{dur(r['seconds'])} ({r['seconds']:.3f} s of wall time), goodput {rate(r['goodput_bps'])} "
             f"({r['goodput_bps'] / line:.2f} of one host link), {r['data_packets']} packets, "
             f"{r['retransmits']} retransmitted, {r['timeouts']} timeouts, {r['cnps']} CNPs",
             f"  rate control: {r['rate_control']}"]
    if r.get("nic_cpu_s"):
        lines.append(f"  soft-NICs' CPU: {r['nic_cpu_s']:.2f} s in {r['seconds']:.2f} s of wall time "
                     f"({r['nic_cpu_s'] / r['seconds']:.2f} cores, the kernel's forwarding in their sends "
                     f"included), {units.format_rate(r['goodput_per_core_bps'])} of goodput per core (emulated)")
    delay = r["receiver"]["nic"].get("cnp_delay_s")
    if delay:
        lines.append(f"  CNPs left the receiver {dur(delay['p50'])} (p50; p90 {dur(delay['p90'])}, max "
                     f"{dur(delay['max'])}) after their marked packet arrived")
    react = r.get("figures", {}).get("reaction")
    if react:
        p50s = react["p50_per_sender"]
        if len(p50s) == 1:
            lines.append(f"  the sender cut its rate {dur(p50s[0])} (p50; p90 {dur(react['p90_max'])}, max "
                         f"{dur(react['max'])}) after a CNP arrived")
        else:
            lines.append(f"  senders cut their rates {dur(p50s[0])}-{dur(p50s[-1])} (p50 per sender; "
                         f"p90 up to {dur(react['p90_max'])}) after a CNP arrived")
    if len(r["flows"]) > 1:
        lines.append(f"  {'sender':<16} {'start':>9} {'time':>9} {'goodput':>12} {'retx':>6} {'CNPs':>6}")
        for f in r["flows"]:
            lines.append(f"  {f['src']:<16} {dur(f['started_s']):>9} {dur(f['seconds']):>9} "
                         f"{rate(f['goodput_bps']):>12} {f['retransmits']:>6} {f['cnps_received']:>6}")
    lines.append(f"  {'QPN':>6} {'done':>9} {'packets':>8} {'retx':>6} {'t/o':>4} {'CNPs':>5} {'srtt':>9} {'rto':>9}")
    for s in r["senders"]:
        for q in s["qps"]:
            done = dur(q["completed_s"]) if q["completed_s"] is not None else "-"
            srtt = dur(q["srtt_s"]) if q["srtt_s"] else "-"
            lines.append(f"  {q['qpn']:>#6x} {done:>9} {q['data_packets']:>8} {q['retransmits']:>6} {q['timeouts']:>4} "
                         f"{q['cnps_received']:>5} {srtt:>9} {dur(q['rto_s']):>9}" + (f"  {q['error']}" if q["error"] else ""))
    fig = r.get("figures", {})
    fair = fig.get("fairness") or {}
    if fair.get("jain"):
        settled = (f"reached {0.95} after {dur(fair['fair_after_s'])} ({fair['fair_after_s'] / r['rtt_s']:.0f} RTTs) "
                   "and stayed" if fair["fair_after_s"] is not None else "never stayed at 0.95 or above")
        lines.append(f"  fairness (Jain, {dur(fair['window_s'])} windows while all sent): whole run "
                     f"{fair['jain_whole']:.3f}, lowest window {fair['jain_min']:.3f}; {settled}")
    if fig.get("ports"):
        lines.append(f"  switch queues while all sent ({fig['ports'][0]['samples']} samples), real bytes:")
        lines.append(f"    {'port':<22} {'p50':>8} {'p90':>8} {'p99':>8} {'max':>8} {'marks':>7} {'drops':>6} {'util':>5}")
        for p in fig["ports"][:6]:
            util = f"{p['utilisation']:.2f}" if p["utilisation"] is not None else "-"
            lines.append(f"    {p['port']:<22} " + " ".join(f"{size(p[k]):>8}" for k in
                                                           ("depth_p50", "depth_p90", "depth_p99", "depth_max"))
                         + f" {p['ecn_marks']:>7} {p['buffer_drops']:>6} {util:>5}")
    if r["telemetry"].get("ports_error"):
        cut = r["telemetry"].get("ports_cut_off_s")
        when = f" after {dur(cut)} of the run" if cut is not None else " before its first reading"
        lines.append(f"  switch telemetry CUT OFF{when}: {r['telemetry']['ports_error']}; the switch "
                     "figures above cover only the time before")
    drops = {}
    for s in r["senders"]:
        drops.update(s["nic"]["dropped"])
    drops.update({f"rx:{k}": v for k, v in r["receiver"]["nic"]["dropped"].items()})
    if drops:
        lines.append("  refused by the NICs: " + ", ".join(f"{k} {v}" for k, v in sorted(drops.items())))
    sc = r.get("scenario") or {}
    if sc and not sc.get("intra_dc_delay_applied"):
        head = "  in-DC latency NOT APPLIED (no netem here, or below the emulator's own forwarding)"
        in_dc = units.format_duration(sc["intra_dc_rtt_s"])
        if sc.get("cross_dc"):  # the path's RTT is the WAN's: nothing to hold it against
            lines.append(f"{head}; the topology's in-DC RTT is {in_dc}")
        else:
            lines.append(f"{head}: the path's RTT was {dur(r['rtt_s'])} against the topology's {in_dc}")
    lines += format_fidelity(r.get("fidelity"))
    return lines


def format_fidelity(f: dict | None) -> list[str]:
    if not f:
        return []
    head = "faithful" if f["faithful"] else "NOT FAITHFUL: these figures include the emulator's own limits"
    lines = [f"  fidelity: {head}"]
    for x in f["findings"]:
        lines.append(f"    {'ok ' if x['ok'] else 'NO '} {x['check']}: {x['message']}")
    lines += [f"    NO  machine: {x}" for x in f["machine_limits"]]
    return lines


def format_stats(body: dict, prev: dict | None = None) -> list[str]:
    """Switch ports first, then the long-haul paths' shares, then the fidelity verdict."""
    interval = body["at"] - prev["at"] if prev else None
    before = {(p["node"], p["ifname"]): p for p in prev["ports"]} if prev else {}
    tm = time_model(body)
    build = body.get("datapath_build")
    dp = body["datapath"] if build in (None, "full") else f"{body['datapath']} ({build} build: no queues modelled)"
    lines = [f"fabric {body['name']!r}  datapath {dp}  hash {body['hash']}", tm.line()]
    if "counters" not in (body["ports"][0] if body["ports"] else {}):
        lines.append("  (kernel datapath: no per-port eBPF counters; qdisc figures only)")
    lines += format_port_table(body["ports"], tm, before, interval, body.get("hash"))
    if body.get("adaptive"):
        lines += format_adaptive(body["adaptive"])
    fid = body["fidelity"]
    if fid["trustworthy"]:
        lines.append(f"fidelity: ok over the last {fid['interval_s']:.1f} s (softirq {fid['softirq_share']:.0%} of CPU)")
    else:
        lines.append("fidelity: NOT TRUSTWORTHY: these figures include effects the topology does not model")
        lines += [f"  - {limit}" for limit in fid["limits"]]
    return lines


def format_port_table(ports: list[dict], tm: TimeModel, before: dict | None = None,
                      interval: float | None = None, hash_mode: str | None = None) -> list[str]:
    """One line per switch port, then each border's RoCE packets per long-haul path; rates,
    depths and the interval in the real fabric's units (``interval`` is wall seconds)."""
    before = before or {}
    rate = lambda bps: units.format_rate(tm.real_rate(bps))  # noqa: E731
    size = lambda nbytes: units.format_size(tm.real_size(nbytes))  # noqa: E731
    lines = []
    head = (f"  {'port':<20} {'rate':>9} {'tx pkts':>9} {'tx now':>10} {'depth':>8} {'max':>8} {'marks':>7} "
            f"{'buf drop':>8} {'down drop':>9} {'bad pkt':>7} {'qdisc drop':>10}")
    lines.append(head)
    paths = []
    for p in ports:
        if p["role"] not in ("leaf", "spine", "border"):
            continue
        c = p.get("counters") or {}
        q = p.get("queue") or {}
        qd = p.get("qdisc") or {}
        tx_now = ""
        old = before.get((p["node"], p["ifname"]))
        if old and interval and c:
            tx_now = rate((c["tx_bytes"] - old["counters"]["tx_bytes"]) * 8 / interval)
        bad = sum(v for k, v in c.items()
                  if k.startswith("drop_") and k not in ("drop_buffer", "drop_loss", "drop_link_down"))
        lines.append(
            f"  {p['node'] + ':' + p['ifname']:<20} {rate(p['rate_bps'] or 0):>9} "
            f"{c.get('tx_pkts', qd.get('packets', 0)):>9} {tx_now:>10} {size(q.get('depth_bytes', 0)):>8} "
            f"{size(q.get('max_depth_bytes', 0)):>8} {c.get('ecn_marks', 0):>7} "
            f"{c.get('drop_buffer', 0):>8} {c.get('drop_link_down', 0):>9} {bad:>7} {qd.get('drops', 0):>10}")
        if "wan_path" in p:
            paths.append(p)
    drained = [p for p in ports if p["role"] in ("leaf", "spine", "border")
               and not (p.get("queue") or {}).get("depth_bytes")
               and ((p.get("counters") or {}).get("drop_buffer") or (p.get("qdisc") or {}).get("drops"))]
    if drained:
        lines.append("  (depth is the queue now, max its high-water mark since up: drops beside a depth of 0, as on "
                     f"{drained[0]['node']}:{drained[0]['ifname']}, came in a burst that has drained since; buf drop "
                     "is over the port's buffer, qdisc drop the kernel qdisc's own)")
    sent = {}
    for p in paths:
        c = p.get("counters") or {}
        sent.setdefault(p["node"], []).append((p["wan_path"], c.get("fwd_pkts", 0)))
    unused = False
    for node, per_path in sent.items():
        total = sum(n for _, n in per_path)
        if not total:
            lines.append(f"  {node} RoCE packets per long-haul path: none sent yet")
            continue
        shares = "  ".join(f"{i}:{n / total:.0%}" for i, n in sorted(per_path))
        lines.append(f"  {node} RoCE packets per long-haul path: {shares}")
        unused = unused or any(n == 0 for _, n in per_path)
    if unused:
        key = {"five-tuple": "its UDP source port", "qpn": "its destination QPN", "qpn-psn": "its QPN and PSN",
               "ev": "the entropy value it carries"}.get(hash_mode or "", "its hash")
        lines.append(f"  (a path at 0% carried none of them: the border hashes each packet by {key}, so a few QPs "
                     "can miss a path; a path down or at weight 0 gets none by design)")
    return lines


def format_pfcwd_config(cfg: dict) -> list[str]:
    """pfcwd's config, as SONiC's `pfcwd show config` lists it (times are the real fabric's)."""
    state = "started" if cfg["enabled"] else "stopped"
    return [f"PFC watchdog {state}: action {cfg['action']}, detection time "
            f"{units.format_duration(cfg['detection_time_s'])}, restoration time "
            f"{units.format_duration(cfg['restoration_time_s'])}, poll interval "
            f"{units.format_duration(cfg['poll_interval_s'])} (real; dilated while running)"]


def format_pfcwd_stats(rows: list[dict]) -> list[str]:
    """SONiC's `pfcwd show stats` columns, one lossless queue per line."""
    lines = [f"{'QUEUE':<22} {'STATUS':<12} {'STORM DETECTED/RESTORED':>24} {'TX OK/DROP':>18} "
             f"{'RX OK/DROP':>18}"]
    for r in rows:
        storms = f"{r['storm_detected']}/{r['storm_restored']}"
        tx, rx = f"{r['tx_ok']}/{r['tx_drop']}", f"{r['rx_ok']}/{r['rx_drop']}"
        lines.append(f"{r['queue']:<22} {r['status']:<12} {storms:>24} {tx:>18} {rx:>18}")
    return lines


def format_recording(body: dict) -> list[str]:
    """``backplane record``: per port that did something, in the real fabric's units."""
    tm = time_model(body)
    readings = body["readings"]
    span = readings[-1]["t"] - readings[0]["t"]
    lines = [f"fabric {body['fabric']!r}: {len(readings)} samples over {units.format_duration(tm.real_time(span))} "
             f"({span:.3f} s wall)", tm.line()]
    rows = body["summary"]
    if not rows:
        return lines + ["  no switch port moved, queued, paused or dropped anything"]
    lines.append(f"  {'PORT':<18} {'MOVED':>10} {'RATE':>12} {'DEPTH END/MAX':>21} {'PAUSED':>7} {'PFC TX':>7} "
                 f"{'DROPS':>6}")
    for r in rows:
        depth = f"{units.format_size(tm.real_size(r['depth_end']))}/{units.format_size(tm.real_size(r['depth_max']))}"
        lines.append(f"  {r['port']:<18} {units.format_size(tm.real_size(r['moved_bytes'])):>10} "
                     f"{units.format_rate(tm.real_rate(r['rate_bps'])):>12} {depth:>21} {r['paused_share']:>7.0%} "
                     f"{r['pauses_sent']:>7} {r['drops']:>6}")
    t0 = readings[0]["t"]
    for s in body.get("storms") or []:
        if s["detected_at"] < t0:
            continue
        restored = (f", restored at +{units.format_duration(tm.real_time(s['restored_at'] - t0))}"
                    if s.get("restored_at") else "")
        lines.append(f"  storm on {s['port']}:{s['prio']} ({s['action']}): detected at "
                     f"+{units.format_duration(tm.real_time(s['detected_at'] - t0))}{restored}")
    return lines


def format_faults(body: dict) -> list[str]:
    """``backplane faults``: each fault's timeline from when it was asked for, real time."""
    tm = time_model(body)
    if not body["faults"]:
        return ["no faults applied"]

    def at(f: dict, key: str) -> str:
        t = f.get(key)
        return "-" if t is None else "+" + units.format_duration(tm.real_time(t - f["asked_at"]))

    lines = [f"  {'ID':>3} {'EVENT':<15} {'TARGET':<18} {'DOWN':>9} {'CONVERGED':>10} {'ROUTES':>10} "
             f"{'RESTORED':>10} {'BACK':>10}  PORTS"]
    for f in body["faults"]:
        lines.append(f"  {f['id']:>3} {f['kind']:<15} {f['target']:<18} {at(f, 'took_effect_at'):>9} "
                     f"{at(f, 'converged_at'):>10} {at(f, 'routes_at'):>10} {at(f, 'restored_at'):>10} "
                     f"{at(f, 'reconverged_at'):>10}  {', '.join(f['ports'])}")
    lines.append(f"  ports down now: {', '.join(body['down']) or 'none'}; withdrawn from ECMP: "
                 f"{', '.join(body['withdrawn']) or 'none'}")
    lines.append("  times from the request; CONVERGED: the datapath's ECMP groups written (RoCE); ROUTES: the "
                 "switches' kernel routes too (ping, TCP)")
    for e in body.get("errors") or []:
        lines.append(f"  ERROR: {e}")
    return lines


def format_run(body: dict) -> list[str]:
    """A scenario run's figures, in the real fabric's time."""
    d = lambda s: "-" if s is None else units.format_duration(s)  # noqa: E731
    r = body["result"]
    lines = []
    if body.get("run_dir"):
        lines.append(f"run {body['run_dir']}")
    tm = time_model(body)
    rate = "algbw" if r.get("op") else "goodput"
    lines.append(f"  workload: {r['op'] + ', ' if r.get('op') else ''}"
                 f"{'intact' if r['intact'] and r['complete'] else 'NOT INTACT'}, "
                 f"{d(tm.real_time(r['seconds']))}, {rate} {units.format_rate(tm.real_rate(r['goodput_bps']))}"
                 + (f", busbw {units.format_rate(tm.real_rate(r['busbw_bps']))}" if r.get("op") else "")
                 + f", {r['retransmits']} resent, {r['timeouts']} timeouts")
    lines.append(f"  {'AT':>8} {'EVENT':<15} {'TARGET':<18} {'LATE':>8} {'DETECTION':>10} {'CONVERGED':>10} "
                 f"{'LOST':>9} {'LOSS WIN':>9} {'STEP':>9} {'BACK':>9} {'FIBER':>6}")
    for e in body["events"]:
        lines.append(f"  {d(e['at_s']):>8} {e['kind']:<15} {e['target']:<18} {d(e.get('applied_late_s')):>8} "
                     f"{d(e.get('detection_s')):>10} {d(e.get('convergence_s')):>10} {d(e.get('time_lost_s')):>9} "
                     f"{d(e.get('loss_window_s')):>9} {d(e.get('loss_window_step_s')):>9} {d(e.get('back_in_ecmp_after_s')):>9} "
                     f"{'-' if e.get('fiber_packets_while_withdrawn') is None else e['fiber_packets_while_withdrawn']:>6}")
        if e.get("error"):
            lines.append(f"           ERROR: {e['error']}")
    lines.append("  LATE: applied after the timeline said; DETECTION: dead to noticed (BFD); CONVERGED: noticed to "
                 "ECMP written; LOST: dead to converged; LOSS WIN: dead to the last sample in which the path's "
                 "borders dropped what was sent into it; STEP: that sample's interval (the loss ended within it); BACK: restored to back in ECMP; FIBER: packets the path's fiber "
                 "carried on from convergence to restore, by its own kernel counters")
    if body.get("plot"):
        lines.append(f"  plot: {body['plot']}")
    return lines


def format_state(body: dict) -> list[str]:
    """The fabric's state at one moment of a stored run."""
    t = body["sample_t_real_s"]
    lines = [f"at {units.format_duration(body['t_real_s'])} (the sample at "
             f"{'-' if t is None else units.format_duration(t)}):"]
    for p in body["paths"]:
        lines.append(f"  wan{p['path']:<3} {'up' if p['up'] else 'DOWN':<5} "
                     f"{'in ECMP' if p['in_ecmp'] else 'withdrawn':<10} share {p['ecmp_share']:.3f}  "
                     f"{units.format_rate(p['rate_bps'])}")
    for q in body["queues"]:
        paused = f", paused priority {','.join(map(str, q['paused_priorities']))}" if q["paused_priorities"] else ""
        lines.append(f"  queue {q['port']}: {units.format_size(q['depth_bytes'])}{paused}")
    if body["senders_rate_bps"] is not None:
        lines.append(f"  senders: {units.format_rate(body['senders_rate_bps'])}")
    return lines


def format_adaptive(a: dict) -> list[str]:
    """Adaptive routing's state: each border port onto a long-haul path, its weight and health."""
    clamped = " (clamped: the machine's floor)" if a["poll_clamped"] else ""
    lines = [f"adaptive routing ({a['mode']}): {a['polls']} polls every {a['poll_wall_s'] * 1e3:g} ms of wall "
             f"time{clamped}, {a['changes']} changes"]
    for p in sorted(a["paths"], key=lambda p: (p["port"].split(":")[0], p["path"])):
        state = "OUT" if p["out"] else "in"
        lines.append(f"  wan{p['path']:<3} {p['port']:<20} {state:<4} weight {p['weight']:<5g} loss {p['loss']:.2%} "
                     f"taken out {p['times_out']}x")
    lines += [f"  ERROR: {e}" for e in a["errors"]]
    return lines


def _admission(window: int) -> str:
    if not window:
        return "no admission (senders write when they hold the data)"
    return f"receiver-driven admission (clear-to-send, {window} message(s) per link and channel)"


def format_collective(body: dict) -> list[str]:
    """A collective as nccl-tests reports one (size, time, algbw, busbw), in the real fabric's
    units and the emulated ones, with the alpha-beta model beside it."""
    r = body
    tm = time_model(r)
    n = len(r["hosts"])
    where = "across both DCs" if r["cross_dc"] else "in one DC"
    real_t, real_size = tm.real_time(r["time_s"]), tm.real_size(r["size"])
    how = ("point to point, " + ", ".join(r["hosts"]) if r["op"] == "all_to_all"
           else f"ring {' -> '.join(r['hosts'])} -> {r['hosts'][0]}")
    lines = [tm.line(),
             f"{r['op']} over {n} hosts {where}, {how}; "
             f"{r['channels']} channel(s) x {r['qps']} QP(s) per link, "
             + (f"chunks of {units.format_size(r['chunk'])}, " if r.get("chunk") else "")
             + f"{r['transport']}, {r['rate_control']}, "
             f"{_admission(r.get('admission', 0))}, line {units.format_rate(tm.real_rate(r['line_rate_bps']))}"]
    status = "intact" if r["intact"] else ("NOT INTACT" if r["complete"] else "INCOMPLETE")
    lines.append(f"  {status}: every rank's result {'equals' if r['intact'] else 'was checked against'} the "
                 f"operation's (SHA-256), {len(r['times_s'])} of {r['iters']} run(s)")
    lines.append(f"  {'':<10} {'size':>10} {'time':>10} {'algbw':>12} {'busbw':>12}")
    if r["time_s"] > 0:
        lines.append(f"  {'real':<10} {units.format_size(real_size):>10} {units.format_duration(real_t):>10} "
                     f"{units.format_rate(tm.real_rate(r['algbw_bps'])):>12} "
                     f"{units.format_rate(tm.real_rate(r['busbw_bps'])):>12}")
        lines.append(f"  {'emulated':<10} {units.format_size(r['size']):>10} {units.format_duration(r['time_s']):>10} "
                     f"{units.format_rate(r['algbw_bps']):>12} {units.format_rate(r['busbw_bps']):>12}")
        lines.append(f"  busbw = algbw x {r['busbw_factor']:.3f} (nccl-tests' factor for {r['op']} at n = {n}); "
                     f"{r['busbw_bps'] / r['line_rate_bps']:.2f} of one host link")
        model = tm.real_time(r["model_s"])
        lines.append(f"  alpha-beta model: {units.format_duration(model)} (line rate, alpha = half the longest "
                     f"hop's RTT, {units.format_duration(tm.real_time(r['alpha_s']))}); measured / model "
                     f"{r['time_s'] / r['model_s']:.2f}")
        if r.get("path_model_s"):
            lines.append(f"  ring-path model: {units.format_duration(tm.real_time(r['path_model_s']))} (each chunk pays "
                         f"only the hops it crosses, as ranks that go on when their data comes do); measured / "
                         f"model {r['time_s'] / r['path_model_s']:.2f}")
        if len(r["times_s"]) > 1:
            lines.append("  runs: " + ", ".join(units.format_duration(tm.real_time(t)) for t in r["times_s"]))
    lines.append(f"  {r['data_packets']} packets, {r['retransmits']} retransmitted, {r['timeouts']} timeouts")
    lines.append("  ring hops' RTT: " + ", ".join(f"{hop} {units.format_duration(tm.real_time(s))}"
                                                  for hop, s in r["hop_rtts_s"].items()))
    if r["cross_dc"] and r.get("wan_delay") is False:
        lines.append("  NO DELAY: this fabric runs without its delay lines (--no-wan-delay): the long-haul paths "
                     "are 0 km long here, and these figures say nothing about distance")
    lines += [f"  NOTE: {n}" for n in r.get("notes") or []]
    if r.get("recorded"):
        rec = r["recorded"]
        lines.append(f"  recorded: {rec['run_dir']} ({rec['ports_rows']} port readings; backplane report "
                     f"{rec['run_dir']}), timeline {rec['plot']}")
    return lines


def format_training(body: dict) -> str:
    """The step model's line: all in the real fabric's time."""
    d = units.format_duration
    return (f"training step: {body['params']:.3g} parameters x {body['bytes_per_param']} B = "
            f"{units.format_size(body['gradient_bytes'])} of gradients; compute {d(body['compute_s'])}, all-reduce "
            f"{d(body['comm_s'])} ({body['overlap']:.0%} of it under the compute): step {d(body['step_s'])}, "
            f"{body['waiting_share']:.1%} of it waiting on the network")
