#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# `make vagrant-smoke`: exercise the Vagrantfile for real on this machine. Builds a local box from
# the delay tier's guest root, runs libvirtd in a network namespace of its own (bp-vagrant) with
# /dev/kvm masked so libvirt uses plain QEMU, brings the Vagrantfile up with that box and runs the
# delay tier through `vagrant ssh`. Everything it starts or defines is removed at the end, also on
# failure and Ctrl-C; it refuses to run beside a libvirtd it did not start.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
venv="${BACKPLANE_VENV:-$here/.venv}"
cache="${BACKPLANE_VAGRANT_DIR:-/var/cache/backplane/vagrant}"
ns=bp-vagrant
box_name=backplane-local
log() { printf '[vagrant-smoke] %s\n' "$*"; }
die() { printf '[vagrant-smoke] error: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "run as root: sudo make vagrant-smoke"
for pidfile in /run/libvirtd.pid /run/virtlogd.pid; do
  if [ -s "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
    die "a libvirt daemon is already running ($pidfile); this smoke test starts and stops its own"
  fi
done

packages=(vagrant vagrant-libvirt libvirt-daemon-system libvirt-clients dnsmasq-base iptables rsync e2fsprogs)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

start=$(date +%s)
root=$("$venv/bin/backplane" vm build | sed -n 's/^guest root \([^ ]*\) .*/\1/p')
[ -d "$root" ] || die "no guest root from backplane vm build"
box="$cache/$(basename "$root").box"
mkdir -p "$cache"
if [ ! -f "$box" ]; then
  rm -f "$cache"/root-*.box "$cache"/root-*.box.*  # boxes of older roots
  bash "$here/scripts/vagrant/build-box.sh" "$root" "$box"
fi

export VAGRANT_HOME="$cache/home" VAGRANT_DOTFILE_PATH="$cache/dotfile" VAGRANT_CWD="$here"
export VAGRANT_DEFAULT_PROVIDER=libvirt VAGRANT_CHECKPOINT_DISABLE=1
export BACKPLANE_BOX="$box_name" BACKPLANE_LIBVIRT_DRIVER=qemu
export BACKPLANE_BOX_KERNEL="$box.vmlinuz" BACKPLANE_BOX_INITRD="$box.initrd"
in_ns() { ip netns exec "$ns" "$@"; }
# vagrant-libvirt defines a storage pool named default when there is none: ours to remove then.
pool_was_defined=0
[ -e /etc/libvirt/storage/default.xml ] && pool_was_defined=1

cleanup() {
  set +e
  log "cleaning up"
  if [ -d "$VAGRANT_DOTFILE_PATH" ]; then in_ns vagrant destroy -f >/dev/null 2>&1; fi
  if [ -S /run/libvirt/libvirt-sock ]; then
    for vol in $(in_ns virsh -q -c qemu:///system vol-list default 2>/dev/null | awk '{print $1}'); do
      case "$vol" in "$box_name"*|backplane*) in_ns virsh -q -c qemu:///system vol-delete --pool default "$vol" >/dev/null ;; esac
    done
    if [ "$pool_was_defined" -eq 0 ]; then
      in_ns virsh -q -c qemu:///system pool-destroy default >/dev/null 2>&1
      in_ns virsh -q -c qemu:///system pool-undefine default >/dev/null 2>&1
    fi
    for net in vagrant-libvirt; do
      in_ns virsh -q -c qemu:///system net-destroy "$net" >/dev/null 2>&1
      in_ns virsh -q -c qemu:///system net-undefine "$net" >/dev/null 2>&1
    done
  fi
  vagrant box remove --force "$box_name" >/dev/null 2>&1
  for pidfile in /run/libvirtd.pid /run/virtlogd.pid; do
    if [ -s "$pidfile" ]; then
      pid=$(cat "$pidfile")
      kill "$pid" 2>/dev/null
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    fi
  done
  ip netns del "$ns" 2>/dev/null
  rm -rf "$VAGRANT_DOTFILE_PATH"
}
trap cleanup EXIT

log "libvirtd in network namespace $ns, /dev/kvm masked"
ip netns add "$ns"
in_ns ip link set lo up
in_ns unshare -m --propagation private sh -c \
  'if [ -e /dev/kvm ]; then mount --bind /dev/null /dev/kvm; fi; virtlogd -d && libvirtd -d'
ready=0
for _ in $(seq 100); do
  if in_ns virsh -q -c qemu:///system version >/dev/null 2>&1; then ready=1; break; fi
  sleep 0.2
done
[ "$ready" -eq 1 ] || die "libvirtd did not answer on qemu:///system"

log "vagrant box add $box_name"
vagrant box add --force --name "$box_name" "$box" >/dev/null
log "vagrant up (libvirt, QEMU software emulation)"
t0=$(date +%s)
in_ns vagrant up --provider libvirt
up_s=$(( $(date +%s) - t0 ))
log "vagrant ssh: the delay tier"
t0=$(date +%s)
rc=0
in_ns vagrant ssh -c 'cd /vagrant && sudo make test-delay' || rc=$?
test_s=$(( $(date +%s) - t0 ))
log "vagrant up ${up_s} s, delay tier ${test_s} s (exit $rc), whole smoke $(( $(date +%s) - start )) s"
exit "$rc"
