#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The demo: bring the default cross-DC fabric up, show it working, tear it down.
# Run through `sudo make demo` (which runs scripts/setup.sh first).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bp="${BACKPLANE_VENV:-$here/.venv}/bin/backplane"
py="${BACKPLANE_VENV:-$here/.venv}/bin/python"
name=demo
topology="${1:-$here/topologies/cross-dc.yaml}"

say() { printf '\n=== %s\n' "$*"; }

# Whatever happens (error, Ctrl-C), leave nothing behind.
cleanup() { "$bp" clean --name "$name" >/dev/null 2>&1 || true; }
trap cleanup EXIT

say "backplane doctor: what this machine can do"
"$bp" doctor || true

if ! "$bp" doctor --json | "$py" -c '
import json, sys
sys.exit(0 if any(c["name"] == "qdisc netem" and c["ok"] for c in json.load(sys.stdin)) else 1)'; then
  if [ -n "${BACKPLANE_IN_VM:-}" ]; then
    echo "error: no sch_netem even inside the VM" >&2
    exit 3
  fi
  say "NOTE: this kernel has no sch_netem, so the 3,000 km long-haul delay cannot be emulated on it."
  echo "    The demo runs inside the delay tier's VM instead (a stock Debian kernel under QEMU), with"
  echo "    the real 15 ms fibers. The first run builds the VM's root (a few minutes); later runs reuse it."
  bash "$here/scripts/vm/setup-host.sh"
  exec "$bp" vm run -- bash scripts/demo.sh "$@"
fi

where="on this machine"
[ -z "${BACKPLANE_IN_VM:-}" ] || where="in the VM (kernel $(uname -r))"
say "backplane up $(basename "$topology") --name $name, $where"
"$bp" up "$topology" --name "$name"

say "backplane status --name $name (rates read back from the kernel, RTTs measured now)"
"$bp" status --name "$name"

say "ping from every east host to every west host"
for src in east-host0 east-host1 east-host2 east-host3; do
  # One exec per source host: each CLI start costs seconds on an emulated CPU.
  "$bp" exec --name "$name" "$src" -- sh -c '
    for dst in 198.18.2.2 198.18.2.3 198.18.3.2 198.18.3.3; do
      echo "  '"$src"' -> $dst: $(ping -n -q -c 3 -i 0.2 -W 2 "$dst" | tail -n 1)"
    done'
done

say "measured rate of one long-haul path (border to border through fiber wan0)"
if [ "$(systemd-detect-virt 2>/dev/null || true)" = qemu ]; then
  echo "    (this CPU is emulated by QEMU, about 20x slower: a figure below 400 Mbps here is the"
  echo "     emulator's limit, not the link's; the VM's tests fill a 20 Mbps path instead)"
fi
"$bp" measure link --name "$name" east-border0 west-border0 --path 0

say "RoCEv2 load across the DCs: 4 host pairs x 16 QPs, the switches' eBPF hashing the destination QP"
"$bp" set-hash --name "$name" qpn
tmp=$(mktemp -d)
for i in 0 1 2 3; do
  "$bp" exec --name "$name" "west-host$i" -- "$py" -m emulator.tools.rocegen recv --qps 16 --timeout 120 --idle 5 \
    > "$tmp/recv$i" &
done
for i in 0 1 2 3; do  # each receiver says "ready" once bound
  for _ in $(seq 600); do grep -q ready "$tmp/recv$i" 2>/dev/null && break; sleep 0.1; done
done
for i in 0 1 2 3; do
  "$bp" exec --name "$name" "east-host$i" -- "$py" -m emulator.tools.rocegen send "198.18.$((2 + i / 2)).$((2 + i % 2))" \
    --qps 16 --packets 20 --payload 1024 --pps 400 --sport pair --pair-id "$i" > "$tmp/send$i" &
done
wait
"$py" - "$tmp" <<'PY'
import json, pathlib, sys
tmp = pathlib.Path(sys.argv[1])
for i in range(4):
    got = json.loads((tmp / f"recv{i}").read_text().splitlines()[-1])
    print(f"  east-host{i} -> west-host{i}: {got['packets']} packets in {got['complete']}/16 QPs, "
          f"{got['out_of_order']} out of order")
PY
rm -rf "$tmp"
"$bp" stats --name "$name" | grep -E "per long-haul path|fidelity|NOT TRUSTWORTHY|^  - "

say "backplane run transfer --name $name east-host0 west-host0 --size 32MB --qps 16  (RDMA WRITEs through the soft-NICs)"
"$bp" run transfer --name "$name" east-host0 west-host0 --size 32MB --qps 16 --transport selective

say "backplane down --name $name"
"$bp" down --name "$name"
trap - EXIT
