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

say "kernel ECMP across the 8 long-haul paths on east-border0"
"$bp" exec --name "$name" east-border0 -- ip route show 198.18.2.0/24

say "backplane down --name $name"
"$bp" down --name "$name"
trap - EXIT
