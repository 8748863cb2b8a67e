#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Make a Vagrant box (libvirt provider) from the delay tier's guest root, so the Vagrantfile can be
# exercised on a machine without a public box: the same Debian bookworm, stock kernel, everything
# scripts/setup.sh installs. Adds what Vagrant needs: a vagrant user with the insecure key and
# password-less sudo, DHCP on eth0, the hostname in /etc/hosts, a writable ext4 root.
#
# Usage: build-box.sh ROOT OUT.box     (as root; `make vagrant-smoke` calls it)
# The box boots the kernel and Debian's initramfs directly (the Vagrantfile passes them to libvirt
# from the files this script leaves next to OUT.box), so it needs no boot loader.
set -euo pipefail
root=$1 out=$2
work="$out.d"
log() { printf '[vagrant-box] %s\n' "$*"; }

key=$(ls /usr/share/rubygems-integration/all/gems/vagrant-*/keys/vagrant.pub 2>/dev/null | head -n 1 || true)
[ -n "$key" ] || { echo "[vagrant-box] error: vagrant's insecure public key not found (apt-get install vagrant)" >&2; exit 1; }
kernel=$(cat "$root/opt/backplane/kernel-release")

rm -rf "$work"
mkdir -p "$work"
stage="$work/rootfs"
log "copying the guest root"
cp -a "$root" "$stage"

chroot "$stage" useradd -m -s /bin/bash -G sudo vagrant
install -d -m 0700 -o "$(chroot "$stage" id -u vagrant)" -g "$(chroot "$stage" id -g vagrant)" "$stage/home/vagrant/.ssh"
install -m 0600 -o "$(chroot "$stage" id -u vagrant)" -g "$(chroot "$stage" id -g vagrant)" "$key" \
  "$stage/home/vagrant/.ssh/authorized_keys"
echo 'vagrant ALL=(ALL) NOPASSWD:ALL' > "$stage/etc/sudoers.d/vagrant"
chmod 0440 "$stage/etc/sudoers.d/vagrant"
printf 'auto lo\niface lo inet loopback\n\nallow-hotplug eth0\niface eth0 inet dhcp\n' > "$stage/etc/network/interfaces"
printf '/dev/vda / ext4 defaults,errors=remount-ro 0 1\n' > "$stage/etc/fstab"
echo backplane-box > "$stage/etc/hostname"
printf '127.0.0.1 localhost\n127.0.1.1 backplane-box\n' > "$stage/etc/hosts"
printf 'UseDNS no\n' > "$stage/etc/ssh/sshd_config.d/vagrant.conf"
# The box already holds the project's venv: provisioning finds it complete and the editable
# install reads the checkout Vagrant syncs to /vagrant.
rm -rf "$stage/opt/backplane/src"
ln -s /vagrant "$stage/opt/backplane/src"
echo 'BACKPLANE_VENV=/opt/backplane/venv' >> "$stage/etc/environment"  # sshd's sessions read it
echo 'Defaults env_keep += "BACKPLANE_VENV"' > "$stage/etc/sudoers.d/backplane"      # and sudo keeps it
chmod 0440 "$stage/etc/sudoers.d/backplane"

log "making the disk"
size_mb=$(( $(du -sm "$stage" | cut -f1) + 3072 ))
mkfs.ext4 -q -L root -d "$stage" "$work/disk.raw" "${size_mb}M"
qemu-img convert -O qcow2 "$work/disk.raw" "$work/box.img"
rm -f "$work/disk.raw"
rm -rf "$stage"
virtual_gb=$(( (size_mb + 1023) / 1024 ))
printf '{"provider": "libvirt", "format": "qcow2", "virtual_size": %d}\n' "$virtual_gb" > "$work/metadata.json"
printf 'Vagrant.configure("2") do |config|\n  config.vm.provider :libvirt do |lv|\n    lv.driver = "kvm"\n  end\nend\n' > "$work/Vagrantfile"
tar -C "$work" -cf "$out" metadata.json Vagrantfile box.img
cp "$root/boot/vmlinuz-$kernel" "$out.vmlinuz"
cp "$root/boot/initrd.img-$kernel" "$out.initrd"
rm -rf "$work"
log "done: $out ($(du -sh "$out" | cut -f1)), kernel $kernel"
