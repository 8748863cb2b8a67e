"""Job profiles: everything a collective's transport is set to at once, as the deployments the
project compares ran it. What a profile asks of the fabric itself (PFC, which a running fabric
cannot change) is checked against the fabric and every difference said, never passed over.

- ``meta``: Gangidi et al., SIGCOMM 2024: E-ECMP hashing the destination QP, 16 QPs per GPU pair,
  DCQCN off, PFC for losslessness, and receiver-driven clear-to-send admission in the collective
  library (workload.rank: two messages per link and channel cleared ahead, so at a distance the
  next step's clear-to-send is in the air while this step's data is).
- ``seed``: the project's own story: QPN hashing, tuned DCQCN (NVIDIA's parameters), selective
  repeat (IRN-style), PFC with its watchdog.
- ``baseline``: what a plain RoCE deployment does: five-tuple ECMP, one QP, go-back-N, DCQCN as
  the topology has it.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class JobProfile:
    name: str
    hash: str  # the switches' ECMP hash mode (set on the running fabric)
    qps: int  # per link
    transport: str
    dcqcn: str | None  # a DCQCN profile name; None: the topology's
    pfc: bool  # the fabric should be lossless in the DCs
    pfcwd: bool  # ... with the watchdog running
    admission: int = 0  # clear-to-send window, messages per link and channel (0: none)


PROFILES = {
    "meta": JobProfile("meta", "qpn", 16, "go-back-n", "off", pfc=True, pfcwd=False, admission=2),
    "seed": JobProfile("seed", "qpn", 16, "selective", "nvidia", pfc=True, pfcwd=True),
    "baseline": JobProfile("baseline", "five-tuple", 1, "go-back-n", None, pfc=False, pfcwd=False),
}


def differences(profile: JobProfile, pfc_enabled: bool, datapath: str) -> list[str]:
    """What this fabric cannot give the profile, each a sentence (empty: it runs as defined)."""
    out = []
    if profile.pfc and not pfc_enabled:
        out.append(f"profile {profile.name} runs lossless (PFC) in the DCs, and this fabric has pfc.enabled: false: "
                   "it runs lossy (up a topology with pfc.enabled: true for the profile as defined)")
    if not profile.pfc and pfc_enabled:
        out.append(f"profile {profile.name} runs lossy, and this fabric has PFC on: it runs lossless")
    if datapath != "ebpf" and profile.hash not in ("five-tuple",):
        out.append(f"profile {profile.name} hashes {profile.hash}, which needs the eBPF datapath; this fabric runs "
                   "the kernel's (five-tuple)")
    return out
