"""``backplane vm``: the delay tier's VM (a stock kernel with sch_netem, under QEMU)."""
from __future__ import annotations

import json
import os
import sys
import time

import click

from emulator.cli.app import core, main, need_root
from emulator.fabric import vm as vm_mod


@main.group()
def vm() -> None:
    """The delay tier: a VM with a stock kernel (sch_netem) that runs commands on this checkout."""


def _vm_config(accel: str | None = None, memory: int | None = None) -> "vm_mod.VmConfig":
    return vm_mod.VmConfig.from_env(accel=accel, memory_mb=memory)


def _progress(line: str) -> None:
    click.echo(line, err=True)


@vm.command(name="build")
@click.option("--force", is_flag=True, help="Build again even if the cached root matches.")
@core
def vm_build(force: bool) -> None:
    """Build (or find in the cache) the guest root and its boot files."""
    need_root("vm build")
    start = time.monotonic()
    guest = vm_mod.build(_vm_config(), _progress, force=force)
    click.echo(f"guest root {guest.root} (kernel {guest.kernel_release}) ready in "
               f"{time.monotonic() - start:.1f} s")


@vm.command(name="run", context_settings={"ignore_unknown_options": True})
@click.option("--timeout", "timeout_s", type=float, default=3000.0, show_default=True,
              help="Stop the VM after this many seconds.")
@click.option("--accel", type=click.Choice(["auto", "kvm", "tcg"]), default=None,
              help="auto: KVM when /dev/kvm really boots the guest, else TCG. [env BACKPLANE_VM_ACCEL]")
@click.option("--memory", type=int, default=None, help="Guest memory in MiB. [env BACKPLANE_VM_MEMORY]")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@core
def vm_run(timeout_s: float, accel: str | None, memory: int | None, command: tuple[str, ...]) -> None:
    """Run COMMAND in the checkout inside the VM; its output streams here, its exit code is ours."""
    need_root("vm run")
    config = _vm_config(accel, memory)
    guest = vm_mod.build(config, _progress)
    result = vm_mod.run(config, guest, list(command), lambda line: click.echo(line), timeout_s)
    click.echo(f"[vm] {result.accel}: guest command started {result.boot_s:.1f} s after QEMU, "
               f"VM ran {result.total_s:.1f} s, exit {result.exit_code}", err=True)
    sys.exit(result.exit_code)


@vm.command(name="info")
@click.option("--json", "as_json", is_flag=True)
@core
def vm_info(as_json: bool) -> None:
    """Where the guest root is cached, whether it is built, and which accelerator would be used."""
    config = _vm_config()
    root = vm_mod.root_path(config)
    info = {"cache_dir": str(config.cache_dir), "root": str(root),
            "built": (root / "opt/backplane/kernel-release").is_file(),
            "mirror": config.mirror or vm_mod.host_mirror() or vm_mod.DEFAULT_MIRROR}
    if info["built"] and os.geteuid() == 0:
        guest = vm_mod.build(config, _progress)
        info["kernel_release"] = guest.kernel_release
        info["accel"] = vm_mod.choose_accel(config, guest, _progress)
    if as_json:
        click.echo(json.dumps(info, indent=2))
    else:
        for k, v in info.items():
            click.echo(f"{k:<15} {v}")
