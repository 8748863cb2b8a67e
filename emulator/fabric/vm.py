"""The delay tier's VM: a stock Debian kernel (with sch_netem) booted by QEMU over a 9p root.

Many kernels lack sch_netem, so the 3,000 km cannot be emulated on them. This module builds and
caches a guest root (debootstrap of bookworm provisioned by scripts/setup.sh), boots its kernel
with QEMU (KVM when /dev/kvm really boots a guest, else software emulation), shares the checkout
into the guest, runs one command there and returns its exit status. The guest has no network
beyond its own namespaces (`-nic none`); the VM is always stopped, also on Ctrl-C and timeout.

The boot skips firmware and the decompressor: QEMU loads the kernel's uncompressed payload (the XZ
stream inside /boot/vmlinuz-*) with -kernel, and a tiny busybox initramfs loads the 9p modules,
mounts the root, the checkout and the run folder, and hands over to scripts/vm/guest-init.
"""
from __future__ import annotations

import fcntl
import gzip
import hashlib
import io
import lzma
import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from emulator import REPO
from emulator.errors import BackplaneError, CapabilityError

DEFAULT_CACHE = Path("/var/cache/backplane/vm")
DEFAULT_MIRROR = "http://deb.debian.org/debian"
# Files whose change means the guest root must be built again.
RECIPE = ("scripts/setup.sh", "scripts/vm/build-root.sh", "requirements.txt", "pyproject.toml")
# Kernel modules the initramfs loads, in order, to mount a 9p root over virtio (with their
# dependencies from modules.dep); any that are built into the kernel are skipped.
BOOT_MODULES = ("virtio_pci", "9pnet_virtio", "9p")
GUEST_SRC = "/opt/backplane/src"
# Large 9p messages: the root is read through them, and they cut the round trips per file read.
# The root never changes under a running guest and the checkout is read as it was at boot, so
# both are mounted cache=loose (Python's imports stat hundreds of files: 15 s -> 6 s under TCG);
# the run folder, which the host reads back, is not cached.
NINEP_OPTS = "trans=virtio,version=9p2000.L,msize=512000"
PROBE_MARK = "backplane-kvm-probe-ok"
KVM_PROBE_TIMEOUT = 20.0
HOST_PACKAGES = ("qemu-system-x86", "debootstrap")
HOST_FIX = "apt-get install --no-install-recommends qemu-system-x86 debootstrap (or: sudo make vm-setup)"

Sink = Callable[[str], None]


class VmError(BackplaneError):
    """The VM could not be built, booted or did not report its command's exit status."""

    exit_code = 8


@dataclass(frozen=True)
class VmConfig:
    cache_dir: Path = DEFAULT_CACHE
    mirror: str | None = None  # None: the host's own Debian mirror, else DEFAULT_MIRROR
    memory_mb: int = 3072
    cpus: int = 2
    accel: str = "auto"  # auto | kvm | tcg

    @classmethod
    def from_env(cls, **overrides) -> "VmConfig":
        """Settings users make through the environment (BACKPLANE_VM_DIR, _MIRROR, _MEMORY, _ACCEL)."""
        env = os.environ
        values: dict = {}
        if env.get("BACKPLANE_VM_DIR"):
            values["cache_dir"] = Path(env["BACKPLANE_VM_DIR"])
        if env.get("BACKPLANE_VM_MIRROR"):
            values["mirror"] = env["BACKPLANE_VM_MIRROR"]
        if env.get("BACKPLANE_VM_MEMORY"):
            if not env["BACKPLANE_VM_MEMORY"].isdigit():
                raise VmError(f"BACKPLANE_VM_MEMORY must be MiB as a whole number, not {env['BACKPLANE_VM_MEMORY']!r}")
            values["memory_mb"] = int(env["BACKPLANE_VM_MEMORY"])
        if env.get("BACKPLANE_VM_ACCEL"):
            values["accel"] = env["BACKPLANE_VM_ACCEL"]
        values.update({k: v for k, v in overrides.items() if v is not None})
        if values.get("accel", "auto") not in ("auto", "kvm", "tcg"):
            raise VmError(f"accelerator must be auto, kvm or tcg, not {values['accel']!r}")
        return cls(**values)


@dataclass(frozen=True)
class Guest:
    """A built guest: its root and the boot files made from it."""

    root: Path
    kernel_release: str
    vmlinux: Path
    initramfs: Path


@dataclass(frozen=True)
class RunResult:
    exit_code: int
    accel: str
    boot_s: float  # from QEMU's start to the guest's first line of its own
    total_s: float


# -- the guest root ---------------------------------------------------------------------------

def recipe_hash(repo: Path = REPO) -> str:
    h = hashlib.sha256()
    for rel in RECIPE:
        h.update(rel.encode() + b"\0" + (repo / rel).read_bytes() + b"\0")
    return h.hexdigest()[:16]


def host_mirror(sources_dir: Path = Path("/etc/apt")) -> str | None:
    """The Debian mirror this machine's apt already uses (a suite named bookworm), if any."""
    files = sorted(sources_dir.glob("sources.list.d/*.sources")) + [sources_dir / "sources.list"]
    files += sorted(sources_dir.glob("sources.list.d/*.list"))
    for f in files:
        try:
            text = f.read_text()
        except OSError:
            continue
        if f.suffix == ".sources":
            for stanza in re.split(r"\n\s*\n", text):
                fields = dict(re.findall(r"^(\w[\w-]*):\s*(.*)$", stanza, re.M))
                if "bookworm" in fields.get("Suites", "").split() and "deb" in fields.get("Types", "").split():
                    return fields.get("URIs", "").split()[0] if fields.get("URIs") else None
        else:
            for line in text.splitlines():
                m = re.match(r"^deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+bookworm\s", line)
                if m:
                    return m.group(1)
    return None


def check_host_tools() -> None:
    for tool in ("qemu-system-x86_64", "debootstrap"):
        if shutil.which(tool) is None:
            raise CapabilityError(f"the delay tier's VM needs {tool}, which is not installed", HOST_FIX)


class _Lock:
    """An exclusive lock on the cache, so two builds never write the same root."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __enter__(self) -> "_Lock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o644)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


def root_path(config: VmConfig, repo: Path = REPO) -> Path:
    return config.cache_dir / f"root-{recipe_hash(repo)}"


def build(config: VmConfig, sink: Sink, repo: Path = REPO, force: bool = False) -> Guest:
    """The guest for this checkout's recipe: from the cache, or built now (streaming to ``sink``)."""
    check_host_tools()
    root = root_path(config, repo)
    with _Lock(config.cache_dir / ".lock"):
        if force and root.exists():
            shutil.rmtree(root)
        if not (root / "opt/backplane/kernel-release").is_file():
            mirror = config.mirror or host_mirror() or DEFAULT_MIRROR
            sink(f"building the guest root {root} (debootstrap of bookworm from {mirror}; a few minutes)")
            start = time.monotonic()
            _stream([str(repo / "scripts/vm/build-root.sh"), str(root), mirror, str(repo)], sink,
                    what="building the guest root")
            sink(f"guest root built in {time.monotonic() - start:.0f} s")
            _prune(config.cache_dir, keep=root)
        return _boot_files(root)


def _prune(cache: Path, keep: Path) -> None:
    """Roots of older recipes are dead weight (about a gigabyte each)."""
    for old in cache.glob("root-*"):
        if old.name.split(".")[0] == keep.name:
            continue
        if old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink(missing_ok=True)


def _stream(argv: list[str], sink: Sink, what: str) -> None:
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace", start_new_session=True)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            sink(line.rstrip("\n"))
        rc = proc.wait()
    except BaseException:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait()
        raise
    if rc != 0:
        raise VmError(f"{what} failed: {shlex.join(argv)} exited with {rc}")


def _boot_files(root: Path) -> Guest:
    release = (root / "opt/backplane/kernel-release").read_text().strip()
    vmlinux = root.parent / f"{root.name}.vmlinux"
    # Named for its init script too, so a changed script never boots from a stale image.
    initramfs = root.parent / f"{root.name}.initramfs-{hashlib.sha256(INIT.encode()).hexdigest()[:8]}"
    for stale in root.parent.glob(f"{root.name}.initramfs*"):
        if stale != initramfs:
            stale.unlink(missing_ok=True)
    if not vmlinux.exists():
        _atomic_write(vmlinux, extract_vmlinux((root / f"boot/vmlinuz-{release}").read_bytes()))
    if not initramfs.exists():
        _atomic_write(initramfs, build_initramfs(root, release))
    return Guest(root, release, vmlinux, initramfs)


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_bytes(data)
    tmp.rename(path)


def extract_vmlinux(bzimage: bytes) -> bytes:
    """The kernel's uncompressed ELF payload: booting it skips the decompressor (slow under TCG)."""
    start = bzimage.find(b"\xfd7zXZ\x00")
    if start < 0:
        raise VmError("the guest kernel image holds no XZ stream; cannot extract vmlinux")
    out = lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(bzimage[start:])
    if out[:4] != b"\x7fELF":
        raise VmError("the guest kernel's XZ payload is not an ELF image")
    return out


# -- the initramfs ------------------------------------------------------------------------------

INIT = r"""#!/bin/busybox sh
# backplane's initramfs: load the 9p modules, mount root, checkout and run folder, hand over.
/bin/busybox --install -s /bin
mkdir -p /proc /sys /dev /newroot
mount -t proc proc /proc
mount -t devtmpfs dev /dev
for m in $(cat /modules.order); do insmod "/$m" || echo "initramfs: insmod $m failed"; done
if grep -q backplane.probe /proc/cmdline; then
  echo %(mark)s > /dev/console
  echo o > /proc/sysrq-trigger
  sleep 10
fi
fail() { echo "initramfs: $*" > /dev/console; echo o > /proc/sysrq-trigger; sleep 10; }
mount -t 9p -o ro,%(opts)s,cache=loose root /newroot || fail "cannot mount the 9p root"
mount -t tmpfs -o mode=0755 tmpfs /newroot/run || fail "cannot mount /run"
mkdir -p /newroot/run/vm
mount -t 9p -o %(opts)s,cache=loose work /newroot%(src)s || fail "cannot mount the checkout"
mount -t 9p -o %(opts)s,cache=none run /newroot/run/vm || fail "cannot mount the run folder"
umount /proc
exec switch_root /newroot %(src)s/scripts/vm/guest-init
""" % {"mark": PROBE_MARK, "opts": NINEP_OPTS, "src": GUEST_SRC}


def boot_modules(root: Path, release: str, wanted: tuple[str, ...] = BOOT_MODULES) -> list[str]:
    """Module files (relative to the modules folder) to load, dependencies first."""
    moddir = root / "lib/modules" / release
    deps: dict[str, list[str]] = {}
    for line in (moddir / "modules.dep").read_text().splitlines():
        name, _, rest = line.partition(":")
        deps[name] = rest.split()
    by_name = {re.sub(r"\.ko(\.\w+)?$", "", Path(p).name).replace("-", "_"): p for p in deps}
    builtin = {re.sub(r"\.ko$", "", Path(p).name).replace("-", "_")
               for p in (moddir / "modules.builtin").read_text().split()}
    order: list[str] = []

    def visit(path: str) -> None:
        for d in reversed(deps[path]):
            visit(d)
        if path not in order:
            order.append(path)

    for mod in wanted:
        key = mod.replace("-", "_")
        if key in builtin:
            continue
        if key not in by_name:
            raise VmError(f"the guest kernel {release} has no module {mod}")
        visit(by_name[key])
    return order


def build_initramfs(root: Path, release: str) -> bytes:
    """A gzip'd newc cpio: busybox, the 9p modules (decompressed) and the init above."""
    files: dict[str, tuple[int, bytes]] = {}
    files["bin/busybox"] = (0o100755, (root / "bin/busybox").read_bytes())
    files["init"] = (0o100755, INIT.encode())
    order = []
    for rel in boot_modules(root, release):
        data = (root / "lib/modules" / release / rel).read_bytes()
        name = Path(rel).name
        if name.endswith(".xz"):
            data, name = lzma.decompress(data), name[:-3]
        elif name.endswith(".zst"):
            raise VmError(f"{rel}: zstd-compressed modules are not supported")
        files[f"lib/{name}"] = (0o100644, data)
        order.append(f"lib/{name}")
    files["modules.order"] = (0o100644, ("\n".join(order) + "\n").encode())
    dirs = ["bin", "lib", "proc", "sys", "dev", "newroot"]
    return gzip.compress(_cpio_newc(dirs, files), compresslevel=6)


def _cpio_newc(dirs: list[str], files: dict[str, tuple[int, bytes]]) -> bytes:
    out = io.BytesIO()
    ino = 1

    def entry(name: str, mode: int, data: bytes) -> None:
        nonlocal ino
        raw = name.encode() + b"\0"
        fields = [ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(raw), 0]
        out.write(b"070701" + b"".join(b"%08X" % f for f in fields) + raw)
        out.write(b"\0" * (-out.tell() % 4))
        out.write(data)
        out.write(b"\0" * (-out.tell() % 4))
        ino += 1

    for d in dirs:
        entry(d, 0o40755, b"")
    for name, (mode, data) in files.items():
        entry(name, mode, data)
    entry("TRAILER!!!", 0, b"")
    return out.getvalue()


# -- booting ------------------------------------------------------------------------------------

def _boot_id() -> str:
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def kvm_usable(config: VmConfig, guest: Guest, sink: Sink) -> bool:
    """Whether KVM really boots this guest. /dev/kvm existing is not enough: some hosts' KVM aborts
    on an MSR or hangs in early boot, so boot once with a short timeout; the verdict is cached
    for this host boot."""
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return False
    cached = config.cache_dir / f"kvm-probe-{_boot_id()}"
    if cached.exists():
        return cached.read_text().strip() == "ok"
    sink(f"probing whether KVM boots the guest (up to {KVM_PROBE_TIMEOUT:.0f} s)")
    with tempfile.TemporaryDirectory(prefix="bp-vm-probe-", dir=config.cache_dir) as tmp:
        log = Path(tmp) / "serial.log"
        argv = _qemu_argv(config, guest, "kvm", log, run_dir=None, extra_append="backplane.probe=1")
        ok = False
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True, preexec_fn=_die_with_parent)
        try:
            deadline = time.monotonic() + KVM_PROBE_TIMEOUT
            while proc.poll() is None and time.monotonic() < deadline:
                if log.exists() and PROBE_MARK in log.read_text(errors="replace"):
                    ok = True
                    break
                time.sleep(0.1)
            if log.exists() and PROBE_MARK in log.read_text(errors="replace"):
                ok = True
        finally:
            _stop(proc)
    for old in config.cache_dir.glob("kvm-probe-*"):
        old.unlink(missing_ok=True)
    cached.write_text("ok\n" if ok else "fails\n")
    return ok


def choose_accel(config: VmConfig, guest: Guest, sink: Sink) -> str:
    if config.accel == "tcg":
        return "tcg"
    usable = kvm_usable(config, guest, sink)
    if config.accel == "kvm" and not usable:
        raise CapabilityError("KVM was asked for but /dev/kvm does not boot the guest",
                              "BACKPLANE_VM_ACCEL=tcg (software emulation, about 20x slower)")
    return "kvm" if usable else "tcg"


def _qemu_argv(config: VmConfig, guest: Guest, accel: str, log: Path, run_dir: Path | None,
               repo: Path = REPO, extra_append: str = "") -> list[str]:
    # Under TCG the kernel falls back to the HPET, and every timestamp in the packet path becomes
    # an emulated MMIO read; TCG's TSC follows the host's clock (a 30 s sleep measured 30.42 s in
    # the guest and 30.42 s on the host), so trust it.
    clock = "tsc=reliable clocksource=tsc" if accel == "tcg" else ""
    append = f"console=ttyS0 panic=-1 quiet loglevel=3 {clock} {extra_append}".strip()
    argv = [
        "qemu-system-x86_64", "-accel", accel, "-cpu", "host" if accel == "kvm" else "max",
        "-M", "q35", "-smp", str(config.cpus), "-m", str(config.memory_mb),
        "-display", "none", "-monitor", "none", "-nodefaults", "-no-reboot", "-nic", "none",
        "-serial", f"file:{log}", "-kernel", str(guest.vmlinux), "-initrd", str(guest.initramfs),
        "-append", append,
        "-virtfs", f"local,path={guest.root},mount_tag=root,security_model=passthrough,readonly=on",
    ]
    if run_dir is not None:
        argv += ["-virtfs", f"local,path={repo},mount_tag=work,security_model=passthrough",
                 "-virtfs", f"local,path={run_dir},mount_tag=run,security_model=passthrough"]
    return argv


# The guest kernel's own last words after the command's exit status is saved.
_POWER_OFF = re.compile(r"^\[\s*\d+\.\d+\] (sysrq: Power Off|reboot: Power down)\s*$")


def _die_with_parent() -> None:
    """In QEMU's child before exec: the kernel kills it if the runner dies, even by SIGKILL."""
    import ctypes

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _stale_runs(runs: Path) -> None:
    """Run folders of runners that no longer exist (killed before they could tidy up)."""
    for d in runs.glob("run-*-*"):
        pid = d.name.split("-")[1]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(d, ignore_errors=True)


def _stop(proc: subprocess.Popen) -> None:
    """QEMU stops at once on SIGTERM; SIGKILL if it does not."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run(config: VmConfig, guest: Guest, command: list[str], sink: Sink, timeout_s: float,
        repo: Path = REPO, env: dict[str, str] | None = None) -> RunResult:
    """Boot the guest, run ``command`` in the checkout there, stream its output to ``sink``."""
    if not command:
        raise VmError("no command to run in the VM")
    accel = choose_accel(config, guest, sink)
    runs = config.cache_dir / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    _stale_runs(runs)
    run_dir = Path(tempfile.mkdtemp(prefix=f"run-{os.getpid()}-", dir=runs))
    # The guest's tests may state how far a figure is off because the CPU is emulated.
    env = {"BACKPLANE_VM_ACCEL": accel, **(env or {})}
    exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items())
    (run_dir / "command").write_text(f"cd {GUEST_SRC}\n{exports}exec {shlex.join(command)}\n")
    log = run_dir / "serial.log"
    log.touch()
    argv = _qemu_argv(config, guest, accel, log, run_dir, repo)
    start = time.monotonic()
    boot_s = float("nan")
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_die_with_parent)
    timed_out = False
    try:
        with open(log, "rb") as f:
            pending = b""
            while True:
                chunk = f.read()
                if chunk:
                    pending += chunk.replace(b"\r\n", b"\n")
                    *lines, pending = pending.split(b"\n")
                    for line in lines:
                        text = line.decode(errors="replace").rstrip("\r")
                        if boot_s != boot_s and text.startswith("backplane-vm:"):
                            boot_s = time.monotonic() - start
                        if not _POWER_OFF.match(text):
                            sink(text)
                elif proc.poll() is not None:
                    break
                elif time.monotonic() - start > timeout_s:
                    timed_out = True
                    break
                else:
                    time.sleep(0.05)
            if pending:
                sink(pending.decode(errors="replace"))
    except BaseException:  # Ctrl-C: the VM is stopped below and nothing of the run is kept
        _stop(proc)
        shutil.rmtree(run_dir, ignore_errors=True)
        raise
    _stop(proc)
    total = time.monotonic() - start
    qemu_out = proc.stdout.read().decode(errors="replace").strip() if proc.stdout else ""
    if timed_out:
        raise VmError(f"the command did not finish within {timeout_s:.0f} s; the VM was stopped "
                      f"(serial log: {log})")
    exit_file = run_dir / "exit"
    if not exit_file.exists():
        detail = f"; QEMU said: {qemu_out}" if qemu_out else ""
        raise VmError(f"the VM stopped without reporting the command's exit status "
                      f"(QEMU exit {proc.returncode}{detail}; serial log: {log})")
    code = int(exit_file.read_text().strip())
    result = RunResult(code, accel, boot_s, total)
    shutil.rmtree(run_dir, ignore_errors=True)
    return result
