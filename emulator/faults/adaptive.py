"""Adaptive routing on the long-haul paths (``ecmp.adaptive``): an agent in the controller reads
each border's ports onto the paths every ``adaptive_interval`` (dilated) and sets their weights
in the ECMP groups through the fault agent, which writes the tables and marks the ports it
takes out. The datapath pins each flow to its next hop until a flowlet gap, so new weights move
only new flows and flowlets; a path taken out moves its flows at once (emulator/faults/agent.py,
ebpf/tc_ingress.c).

  - ``queue``: a path's weight falls with its queue: 1 / (1 + depth / reference), the
    reference being the ECN threshold Kmax (where the fabric calls a queue congested).
  - ``health``: a path whose packets are lost (the border's drops onto it: its configured loss
    or bit errors, a dead link; or its fiber's netem drops) above ``health_threshold`` of what
    it carried over the last interval is taken out; after a hold-down it is tried again, and
    taken out again if it still loses.

Decisions are pure (``decide``); the agent's thread only reads counters and applies them.
"""
from __future__ import annotations

import threading
from dataclasses import asdict, dataclass

from emulator.model.plan import FabricPlan, SWITCH_ROLES

# Polls a path stays out before health tries it again (dampening, as routers do for flaps).
HOLD_DOWN_POLLS = 20
# Below this the agent's thread cannot keep time on these machines (wall s).
MIN_POLL_WALL_S = 0.010
# A path must have carried this many packets in an interval for its loss share to count.
MIN_PACKETS = 20


@dataclass
class PathState:
    """One border port onto a long-haul path, as the agent sees it."""

    port: str
    path: int
    weight: float = 1.0
    out: bool = False
    loss: float = 0.0  # share of packets lost in the last interval it carried any
    depth: int = 0  # emulated bytes queued at the last poll
    held_until: int = 0  # poll number it may be tried again from
    times_out: int = 0
    sent_while_out: int = 0  # packets sent onto it over the polls after the one that took it out

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class Reading:
    """A border port's counters at one poll: packets sent onto the path, packets lost on it."""

    sent: int
    lost: int
    depth: int


def decide(mode: str, states: dict[str, PathState], before: dict[str, Reading], now: dict[str, Reading],
           poll: int, threshold: float, reference: int) -> bool:
    """Update each path's weight and whether it is out from two readings; True if any changed."""
    changed = False
    for port, st in states.items():
        a, b = before.get(port), now[port]
        st.depth = b.depth
        if mode == "queue":
            w = round(1.0 / (1.0 + b.depth / reference), 2) if reference else 1.0
            if w != st.weight:
                st.weight, changed = w, True
            continue
        if a is None:
            continue
        sent, lost = b.sent - a.sent, b.lost - a.lost
        if st.out:
            st.sent_while_out += sent
        if sent + lost:
            st.loss = lost / (sent + lost)  # else: the last interval it carried packets in
        bad = sent + lost >= MIN_PACKETS and st.loss > threshold
        if bad and not st.out:
            st.out, st.held_until, changed = True, poll + HOLD_DOWN_POLLS, True
            st.times_out += 1
        elif st.out and poll >= st.held_until:
            st.out, changed = False, True  # tried again; taken out again if it still loses
    return changed


class AdaptiveAgent:
    """Reads the borders' long-haul ports and sets their weights; ``close()`` stops it."""

    def __init__(self, fault_agent, datapath, plan: FabricPlan, counters_of=None) -> None:
        spec = plan.spec
        self.fault_agent, self.datapath, self.plan = fault_agent, datapath, plan
        self.mode, self.threshold = spec.ecmp.adaptive, spec.ecmp.health_threshold
        self.poll_s = max(MIN_POLL_WALL_S, spec.emulated_time(spec.ecmp.adaptive_interval_s))
        self.clamped = self.poll_s > spec.emulated_time(spec.ecmp.adaptive_interval_s)
        self.reference = spec.emulated_size(spec.ecn.kmax)
        self.counters_of = counters_of  # port -> extra losses (the fiber's netem drops), or None
        self.states: dict[str, PathState] = {}
        for link in plan.links:
            if link.kind != "wan":
                continue
            for end in (link.a, link.b):
                if plan.node(end.node).role in SWITCH_ROLES:
                    name = f"{end.node}:{end.ifname}"
                    self.states[name] = PathState(name, link.path)
        self._ifindex = {f"{p.node}:{p.ifname}": p.ifindex for p in plan.ports()}
        self.polls, self.changes = 0, 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._last: dict[str, Reading] = {}
        self._thread = threading.Thread(target=self._run, name="adaptive", daemon=True)
        self._thread.start()

    def _read(self) -> dict[str, Reading]:
        out = {}
        for port in self.states:
            i = self._ifindex[port]
            c = self.datapath.counters(i)
            extra = self.counters_of(port) if self.counters_of else 0
            out[port] = Reading(c["tx_pkts"], c["drop_loss"] + c["drop_link_down"] + c["drop_buffer"] + extra,
                                self.datapath.queue(i)["depth"])
        return out

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                now = self._read()
                self.polls += 1
                if decide(self.mode, self.states, self._last, now, self.polls, self.threshold, self.reference):
                    self.changes += 1
                    self.fault_agent.set_weights({p: s.weight for p, s in self.states.items()},
                                                 {p for p, s in self.states.items() if s.out})
                    now = self._read()  # the next interval starts once the tables are written
                self._last = now
            except Exception as e:  # noqa: BLE001 - maps gone with the fabric; keep the reason
                self.errors.append(f"{type(e).__name__}: {e}")
                return

    def summary(self) -> dict:
        return {"mode": self.mode, "poll_wall_s": self.poll_s, "poll_clamped": self.clamped, "polls": self.polls,
                "changes": self.changes, "threshold": self.threshold, "errors": list(self.errors),
                "paths": [s.as_dict() for s in self.states.values()]}

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
