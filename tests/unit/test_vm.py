"""The delay tier's VM: the pure parts (mirror, recipe hash, initramfs, kernel payload, config)."""
from __future__ import annotations

import gzip
import lzma
import shutil
from pathlib import Path

import pytest

from emulator.fabric import vm

REPO = Path(__file__).resolve().parents[2]


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_host_mirror_from_deb822_sources(tmp_path):
    write(tmp_path / "sources.list.d/debian.sources",
          "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\n"
          "Components: main\n\nTypes: deb\nURIs: http://mirror.example/debian-security\n"
          "Suites: bookworm-security\nComponents: main\n")
    assert vm.host_mirror(tmp_path) == "http://mirror.example/debian"


def test_host_mirror_from_one_line_sources(tmp_path):
    write(tmp_path / "sources.list", "# comment\ndeb [arch=amd64] http://m.example/debian bookworm main\n")
    assert vm.host_mirror(tmp_path) == "http://m.example/debian"


def test_host_mirror_ignores_other_distributions(tmp_path):
    write(tmp_path / "sources.list", "deb http://archive.ubuntu.com/ubuntu jammy main\n")
    assert vm.host_mirror(tmp_path) is None


def test_recipe_hash_follows_every_input(tmp_path):
    for rel in vm.RECIPE:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / rel, tmp_path / rel)
    first = vm.recipe_hash(tmp_path)
    assert first == vm.recipe_hash(tmp_path)
    seen = {first}
    for rel in vm.RECIPE:
        with open(tmp_path / rel, "a") as f:
            f.write("\n# changed\n")
        seen.add(vm.recipe_hash(tmp_path))
    assert len(seen) == len(vm.RECIPE) + 1


def fake_modules(root: Path, release: str) -> None:
    moddir = root / "lib/modules" / release
    write(moddir / "modules.dep",
          "kernel/fs/9p/9p.ko: kernel/net/9p/9pnet.ko kernel/fs/netfs/netfs.ko\n"
          "kernel/net/9p/9pnet_virtio.ko.xz: kernel/net/9p/9pnet.ko kernel/drivers/virtio/virtio_ring.ko\n"
          "kernel/net/9p/9pnet.ko:\n"
          "kernel/fs/netfs/netfs.ko:\n"
          "kernel/drivers/virtio/virtio_ring.ko:\n")
    write(moddir / "modules.builtin", "kernel/drivers/virtio/virtio_pci.ko\n")
    for rel in ("kernel/fs/9p/9p.ko", "kernel/net/9p/9pnet.ko", "kernel/fs/netfs/netfs.ko",
                "kernel/drivers/virtio/virtio_ring.ko"):
        write(moddir / rel, f"module {rel}")
    (moddir / "kernel/net/9p/9pnet_virtio.ko.xz").write_bytes(lzma.compress(b"module 9pnet_virtio"))
    write(root / "bin/busybox", "busybox")


def test_boot_modules_load_dependencies_first_and_skip_builtins(tmp_path):
    fake_modules(tmp_path, "6.1.0-test")
    order = vm.boot_modules(tmp_path, "6.1.0-test")
    names = [Path(p).name for p in order]
    assert "virtio_pci.ko" not in names  # built in
    assert names.index("9pnet.ko") < names.index("9pnet_virtio.ko.xz")
    assert names.index("virtio_ring.ko") < names.index("9pnet_virtio.ko.xz")
    assert names.index("netfs.ko") < names.index("9p.ko")
    assert len(names) == len(set(names)) == 5


def test_boot_modules_name_a_missing_module(tmp_path):
    fake_modules(tmp_path, "6.1.0-test")
    with pytest.raises(vm.VmError, match="no module nosuch"):
        vm.boot_modules(tmp_path, "6.1.0-test", ("nosuch",))


def parse_newc(data: bytes) -> dict[str, tuple[int, bytes]]:
    out, pos = {}, 0
    while True:
        assert data[pos:pos + 6] == b"070701"
        fields = [int(data[pos + 6 + 8 * i:pos + 14 + 8 * i], 16) for i in range(13)]
        mode, filesize, namesize = fields[1], fields[6], fields[11]
        pos += 110
        name = data[pos:pos + namesize - 1].decode()
        pos += namesize
        pos += -pos % 4
        body = data[pos:pos + filesize]
        pos += filesize
        pos += -pos % 4
        if name == "TRAILER!!!":
            return out
        out[name] = (mode, body)


def test_initramfs_is_a_newc_archive_with_init_busybox_and_decompressed_modules(tmp_path):
    fake_modules(tmp_path, "6.1.0-test")
    files = parse_newc(gzip.decompress(vm.build_initramfs(tmp_path, "6.1.0-test")))
    assert files["init"][0] == 0o100755 and files["init"][1].startswith(b"#!/bin/busybox sh")
    assert files["bin/busybox"] == (0o100755, b"busybox")
    assert files["lib/9pnet_virtio.ko"][1] == b"module 9pnet_virtio"
    order = files["modules.order"][1].decode().split()
    assert order[-1] == "lib/9p.ko" and all(name in files for name in order)
    assert files["newroot"][0] == 0o40755


def test_vmlinux_is_the_xz_payload_of_the_bzimage():
    elf = b"\x7fELF" + bytes(range(256)) * 64
    bzimage = b"MZ setup code" * 100 + lzma.compress(elf, format=lzma.FORMAT_XZ) + b"\0" * 37
    assert vm.extract_vmlinux(bzimage) == elf


def test_vmlinux_extraction_refuses_an_image_without_xz():
    with pytest.raises(vm.VmError, match="no XZ stream"):
        vm.extract_vmlinux(b"MZ" + bytes(1000))


def test_config_from_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("BACKPLANE_VM_DIR", str(tmp_path))
    monkeypatch.setenv("BACKPLANE_VM_ACCEL", "tcg")
    monkeypatch.setenv("BACKPLANE_VM_MEMORY", "2048")
    config = vm.VmConfig.from_env()
    assert (config.cache_dir, config.accel, config.memory_mb) == (tmp_path, "tcg", 2048)
    assert vm.VmConfig.from_env(accel="kvm").accel == "kvm"
    monkeypatch.setenv("BACKPLANE_VM_ACCEL", "fast")
    with pytest.raises(vm.VmError, match="auto, kvm or tcg"):
        vm.VmConfig.from_env()
