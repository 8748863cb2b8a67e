#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# One idempotent set-up for backplane on Debian 12 / Ubuntu 22.04+: distribution packages, kernel
# headers that bcc can compile against, and a virtual environment (.venv) with the Python
# dependencies. Safe to run again: every step checks before it acts.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
venv="${BACKPLANE_VENV:-$here/.venv}"
headers_root="${BACKPLANE_HEADERS_DIR:-/var/lib/backplane}"
# The kernel to provision headers for: the running one, unless set (the VM root is provisioned in a
# chroot, where `uname -r` names the host's kernel, not the guest's).
kernel="${BACKPLANE_KERNEL_RELEASE:-$(uname -r)}"

log() { printf '[setup] %s\n' "$*"; }
die() { printf '[setup] error: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "run as root: sudo scripts/setup.sh (or sudo make setup)"
command -v apt-get >/dev/null || die "apt-get not found: backplane supports Debian 12 and Ubuntu 22.04+"

# Distribution packages. Mininet's package brings mnexec; --no-install-recommends keeps Open vSwitch
# out (backplane's switches are Linux routers with eBPF, never OVS). bcc comes from the
# distribution (python3-bpfcc); PyPI's "bcc" is an unrelated project. libibverbs' providers and
# pyverbs drive a kernel RoCE peer (rdma_rxe) against the soft-NIC (tests/rxe, examples/rxe_interop.py).
packages=(
  mininet iproute2 ethtool iputils-ping tcpdump tshark iperf3 procps psmisc
  bpfcc-tools python3-bpfcc libbpfcc clang llvm python3 python3-venv python3-dev
  linux-headers-amd64
  ibverbs-providers python3-pyverbs
)
kernel_headers="linux-headers-$kernel"
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
have_exact_headers=0
if [ -d "/lib/modules/$kernel/build/include" ]; then
  have_exact_headers=1
fi
if [ ${#missing[@]} -gt 0 ] || [ "$have_exact_headers" -eq 0 ]; then
  log "apt-get update"
  apt-get update -qq
fi
if [ "$have_exact_headers" -eq 0 ] && apt-cache show "$kernel_headers" >/dev/null 2>&1; then
  missing+=("$kernel_headers")
fi
if [ "$(dpkg --print-architecture)" != amd64 ]; then
  # linux-headers-amd64 is the Debian meta package; other architectures use their own.
  missing=("${missing[@]/linux-headers-amd64/linux-headers-$(dpkg --print-architecture)}")
fi
if [ ${#missing[@]} -gt 0 ]; then
  log "installing: ${missing[*]}"
  # tshark asks whether non-root users may capture; answer for it.
  echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" \
    || die "apt-get install failed for: ${missing[*]}"
fi
command -v mnexec >/dev/null || die "mnexec missing after installing the 'mininet' package"

# Kernel headers for bcc. Prefer the running kernel's own; where the distribution has none (a
# custom kernel), merge the distribution's generic '-common' and arch header folders into one tree
# and point bcc at it with BCC_KERNEL_SOURCE. backplane's programs use only UAPI structs, so
# headers of a nearby version are enough.
if [ ! -d "/lib/modules/$kernel/build/include" ]; then
  common=$(ls -d /usr/src/linux-headers-*-common 2>/dev/null | sort -V | tail -n 1 || true)
  [ -n "$common" ] || die "no kernel headers: apt-get install linux-headers-amd64"
  arch_dir="${common%-common}-$(dpkg --print-architecture)"
  [ -d "$arch_dir" ] || die "missing $arch_dir: apt-get install linux-headers-$(dpkg --print-architecture)"
  merged="$headers_root/kernel-headers/$(basename "${common%-common}")"
  if [ ! -f "$merged/.complete" ]; then
    log "merging $common and $arch_dir into $merged for bcc"
    rm -rf "$merged.tmp"
    mkdir -p "$merged.tmp"
    cp -a "$common/." "$merged.tmp/"
    cp -a --remove-destination "$arch_dir/." "$merged.tmp/"
    touch "$merged.tmp/.complete"
    rm -rf "$merged"
    mv "$merged.tmp" "$merged"
  fi
  ln -sfn "$merged" "$headers_root/kernel-headers/current"
fi

# Python: a venv on the distribution's interpreter that also sees its site-packages, because bcc's
# Python bindings (python3-bpfcc) exist only there.
py=/usr/bin/python3
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import bcc' 2>/dev/null; then
  log "creating $venv"
  rm -rf "$venv"
  "$py" -m venv --system-site-packages "$venv"
fi
stamp="$venv/.requirements.sha256"
want=$(cat "$here/requirements.txt" "$here/pyproject.toml" | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  log "installing Python dependencies into $venv"
  "$venv/bin/pip" install -q --disable-pip-version-check -r "$here/requirements.txt"
  "$venv/bin/pip" install -q --disable-pip-version-check --no-deps -e "$here"
  echo "$want" > "$stamp"
fi
"$venv/bin/python" -c 'import bcc, mininet, pyroute2, scapy, click, yaml' \
  || die "the venv cannot import its dependencies; remove $venv and run again"
log "ready: $venv/bin/backplane doctor"
