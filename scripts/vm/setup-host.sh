#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# What the machine needs to build and boot the delay tier's VM: QEMU and debootstrap (and
# qemu-img, for the Vagrant box). Idempotent, like scripts/setup.sh.
set -euo pipefail
log() { printf '[vm-setup] %s\n' "$*"; }
[ "$(id -u)" -eq 0 ] || { echo "[vm-setup] error: run as root (sudo make vm-setup)" >&2; exit 1; }
packages=(qemu-system-x86 qemu-utils debootstrap)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" \
    || { echo "[vm-setup] error: apt-get install failed for: ${missing[*]}" >&2; exit 1; }
fi
log "ready: QEMU $(qemu-system-x86_64 --version | head -n 1 | awk '{print $4}'), debootstrap"
