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

t0=$(date +%s)
say() { printf '\n=== [%3d s] %s\n' "$(( $(date +%s) - t0 ))" "$*"; }

# Whatever happens (error, Ctrl-C), leave nothing behind.
cleanup() { "$bp" clean --name "$name" >/dev/null 2>&1 || true; }
trap cleanup EXIT

# In the VM `up` checks what it needs itself: the doctor there would only repeat this one, with
# the VM tools the guest does not need marked FAIL, and its bcc check costs a compile under TCG.
if [ -z "${BACKPLANE_IN_VM:-}" ]; then
  say "backplane doctor: what this machine can do"
  "$bp" doctor || true
fi

if ! (cd "$here" && "$py" -c 'import sys; from emulator.fabric.capabilities import has_netem; sys.exit(0 if has_netem() else 1)'); then
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
time_args=()
if [ "${BACKPLANE_VM_ACCEL:-}" = tcg ]; then
  # The same settings bench/distance.py takes in such a guest (TCG_SCALE, TCG_DILATION there).
  time_args=(--scale 5e-6 --dilation 200)
  say "NOTE: this VM's CPU is emulated by QEMU (about 20x slower), so the fabric runs at scale 5e-6"
  echo "    (a 400 Gb/s link is 2 Mb/s here) and dilation 200 (15 ms of fiber take 3 s): every figure"
  echo "    below is converted back to the real fabric's units, and the status line 'time model' says how."
fi
started=$(date +%s)
say "backplane up $(basename "$topology") --name $name ${time_args[*]}, $where"
"$bp" up "$topology" --name "$name" "${time_args[@]}"

# No pings here: a dilated cross-DC ping takes 6 s of wall time, and the all-reduces below measure
# their ring's RTTs themselves (the answer's alpha is the long haul's, measured).
say "backplane status --name $name --no-rtt (rates read back from the kernel)"
"$bp" status --name "$name" --no-rtt

out="$here/demo-out"
say "the headline question: what do 3,000 km cost a ring all-reduce? (bench/distance.py, short)"
echo "    4 ranks in the east DC against 2 east + 2 west (the ring crosses the long-haul paths twice),"
echo "    1 GB (the real fabric's bytes; bench/distance.py runs 1 MB to 1 GB), profiles meta (16 QPs, QPN"
echo "    hashing, clear-to-send admission, no DCQCN) and seed (tuned DCQCN, selective repeat); each result"
echo "    checked by sha256."
"$py" "$here/bench/distance.py" --fabric "$name" --ranks 4 --sizes 1GB --profiles meta,seed --losses 0 \
  --iters 1 --out "$out"

say "backplane stats --name $name (the switches' eBPF counters after those runs)"
"$bp" stats --name "$name"

say "backplane down --name $name"
"$bp" down --name "$name"
trap - EXIT
where_out="$out" since=""
# The guest mounts the checkout at its own path: tell the user where it is on their machine.
[ -z "${BACKPLANE_IN_VM:-}" ] || { where_out="demo-out/ in the checkout (the VM's $out)"; since=" after the VM's boot"; }
say "done in $(( $(date +%s) - started )) s$since; the plot and the pcap are in $where_out"
