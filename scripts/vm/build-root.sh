#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Build the delay tier's guest root: Debian bookworm with its stock kernel (which has sch_netem as a
# module), provisioned by the project's own scripts/setup.sh into /opt/backplane/venv. The same root
# also carries what a Vagrant box needs (systemd, sshd, sudo, DHCP), so one build serves both.
#
# Usage: build-root.sh ROOT MIRROR REPO    (as root; `backplane vm build` calls it)
# Builds into ROOT.tmp and renames it to ROOT only when complete, so a cache is never half made.
set -euo pipefail
root=$1 mirror=$2 repo=$3
tmp="$root.tmp"
log() { printf '[vm-root] %s\n' "$*"; }

mounted=()
unmount_all() {
  local i
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount -R -l "${mounted[$i]}" 2>/dev/null || true; done
  mounted=()
}
trap unmount_all EXIT

rm -rf "$tmp"
mkdir -p "$tmp"
log "debootstrap bookworm into $tmp from $mirror"
debootstrap --variant=minbase \
  --include=linux-image-amd64,busybox-static,kmod,ca-certificates,make,procps,systemd-sysv,openssh-server,sudo,ifupdown,isc-dhcp-client,rsync \
  bookworm "$tmp" "$mirror"

kernel=$(ls "$tmp/lib/modules" | sort -V | tail -n 1)
[ -n "$kernel" ] || { echo "[vm-root] error: no kernel modules in $tmp/lib/modules" >&2; exit 1; }
log "guest kernel $kernel"

# The project files setup.sh reads (its package list, requirements, the package for `pip -e`); the
# live checkout is mounted over this copy when the guest boots, so only provisioning uses it.
src="$tmp/opt/backplane/src"
mkdir -p "$src"
tar -C "$repo" --exclude=./.git --exclude=./.venv --exclude='*.pyc' -cf - . | tar -C "$src" -xf -

cp -L /etc/resolv.conf "$tmp/etc/resolv.conf"
# Certificate authorities this machine's administrator added (a proxy's, say) are trusted by the
# provisioning too, or pip cannot reach the package index the host itself uses.
if compgen -G "/usr/local/share/ca-certificates/*" >/dev/null; then
  cp -a /usr/local/share/ca-certificates/. "$tmp/usr/local/share/ca-certificates/"
  chroot "$tmp" update-ca-certificates >/dev/null
fi
# The host's pip and proxy settings from the environment carry over; nothing else does.
passthrough=()
while IFS= read -r var; do passthrough+=("$var=${!var}"); done \
  < <(compgen -e | grep -E '^(PIP_(INDEX_URL|EXTRA_INDEX_URL|TRUSTED_HOST|DEFAULT_TIMEOUT)|https?_proxy|HTTPS?_PROXY|no_proxy|NO_PROXY)$' || true)
# Daemons installed in a chroot must not start on the build machine.
printf '#!/bin/sh\nexit 101\n' > "$tmp/usr/sbin/policy-rc.d"
chmod 0755 "$tmp/usr/sbin/policy-rc.d"
for fs in proc sys dev; do
  mount --rbind "/$fs" "$tmp/$fs"
  mount --make-rslave "$tmp/$fs"
  mounted+=("$tmp/$fs")
done
log "provisioning with scripts/setup.sh"
chroot "$tmp" env -i "${passthrough[@]}" BACKPLANE_VENV=/opt/backplane/venv BACKPLANE_KERNEL_RELEASE="$kernel" \
  DEBIAN_FRONTEND=noninteractive HOME=/root LANG=C.UTF-8 \
  PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  bash /opt/backplane/src/scripts/setup.sh
# Matplotlib's font list, built once here: the guest's home is in memory, and building it on the
# first plot of every boot costs 7 s under TCG. The guest init copies it into its home.
chroot "$tmp" env -i HOME=/root MPLCONFIGDIR=/opt/backplane/matplotlib \
  /opt/backplane/venv/bin/python -c 'import matplotlib.font_manager'
chroot "$tmp" apt-get clean
unmount_all
rm -f "$tmp/usr/sbin/policy-rc.d"

echo backplane-vm > "$tmp/etc/hostname"
printf '127.0.0.1 localhost\n127.0.1.1 backplane-vm\n' > "$tmp/etc/hosts"
: > "$tmp/etc/resolv.conf"
# Mount points the guest init uses.
mkdir -p "$tmp/run/vm"
# Trim what a test VM never reads.
rm -rf "$tmp"/usr/share/doc/* "$tmp"/usr/share/man/* "$tmp"/usr/share/info/* \
       "$tmp"/var/lib/apt/lists/* "$tmp"/root/.cache "$tmp"/var/cache/apt/*.bin
echo "$kernel" > "$tmp/opt/backplane/kernel-release"
rm -rf "$root"
mv "$tmp" "$root"
log "done: $(du -sh "$root" | cut -f1) in $root"
