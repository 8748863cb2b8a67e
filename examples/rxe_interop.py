#!/usr/bin/env python3
"""Check the emulator's soft-NIC against the kernel's RoCEv2 (Linux Soft-RoCE, rdma_rxe) here.

Builds a veth pair with an rxe device on one end (root namespace) and the soft-NIC on the other
(a namespace of its own), then runs RC operations both ways through libibverbs: WRITE,
WRITE_WITH_IMM, SEND, SEND_WITH_IMM and READ, from 1 byte to 64 KiB across the 1024-byte path
MTU, in both of the soft-NIC's transports, with one packet lost on the wire and with the
receiver not ready (RNR). Every byte, immediate and work completion is checked on both sides.
Then it measures goodput both ways. Needs root and a kernel with rdma_rxe; on one without
(these projects' CI machines) run it in the delay tier's VM:

    sudo .venv/bin/python examples/rxe_interop.py [--quick] [--pcap FILE] [--json]
    sudo .venv/bin/backplane vm run -- .venv/bin/python examples/rxe_interop.py

Exit status: 0 when every case passed, 1 when any failed, 3 when the machine cannot run rxe.
"""
from __future__ import annotations

import argparse
import json
import sys
from contextlib import nullcontext
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from emulator.errors import CapabilityError  # noqa: E402
from emulator.fabric import rxe  # noqa: E402
from emulator.workload import interop  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="lengths 1, 1025 and 64 KiB only")
    ap.add_argument("--pcap", type=Path, help="write every RoCEv2 packet to this file")
    ap.add_argument("--goodput-mib", type=int, default=8, help="size of the goodput transfers (MiB; 0: none)")
    ap.add_argument("--json", action="store_true", help="one JSON record per case instead of the table")
    args = ap.parse_args()
    try:
        rxe.check()
    except CapabilityError as e:
        print(f"error: {e}", file=sys.stderr)
        return 3
    cases = interop.matrix()
    if args.quick:
        cases = [c for c in cases if c.length in (1, 1025, interop.LOSS_LENGTH)]
    failed = 0
    with rxe.rxe_link() as link:
        rig = interop.Rig(link)
        try:
            if not args.json:
                print(f"rxe device {link.device} at {link.rxe_ip} <-> soft-NIC at {link.nic_ip} "
                      f"(namespace {link.namespace}), path MTU {link.path_mtu}")
                print(f"{'case':<48} {'result':<6} {'s':>6} {'retx':>5} {'t/o':>4}  detail")
            with interop.capture(link.netdev, args.pcap) if args.pcap else nullcontext():
                for case in cases:
                    out = rig.run(case)
                    failed += not out.ok
                    if args.json:
                        print(json.dumps(out.as_dict()), flush=True)
                    else:
                        print(f"{case.name:<48} {'ok' if out.ok else 'FAIL':<6} {out.seconds:>6.3f} "
                              f"{out.retransmits:>5} {out.timeouts:>4}  {out.detail}", flush=True)
                if args.goodput_mib:
                    size = args.goodput_mib << 20
                    for requester, op in (("softnic", "write"), ("rxe", "write"), ("softnic", "read"), ("rxe", "read")):
                        bps, out = interop.goodput(rig, requester, op, size)
                        failed += not out.ok
                        line = (f"goodput {out.case.name}: {bps / 1e6:.1f} Mb/s ({size >> 20} MiB in "
                                f"{out.seconds:.2f} s; soft-NIC retransmits {out.retransmits}, timeouts "
                                f"{out.timeouts}){'' if out.ok else ' FAIL ' + out.detail}")
                        if out.rxe_counters.get("send_err"):
                            # rxe stops a reply when a send fails (a full receive backlog behind
                            # the veth) until the requester asks again: the soft-NIC's timeouts.
                            line += (f"\n  rxe failed {out.rxe_counters['send_err']} sends (its hw_counters "
                                     f"send_err); it resumes only when the requester asks again")
                        print(json.dumps({"goodput_bps": bps, **out.as_dict()}) if args.json else line, flush=True)
        finally:
            rig.close()
    if not args.json:
        print(f"all {len(cases)} cases passed" if not failed else f"{failed} FAILED")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
