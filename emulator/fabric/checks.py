"""What this machine must offer a fabric before any of it is built: checked by `up` before it
starts a controller, and by the fabric itself before it builds (without importing Mininet)."""
from __future__ import annotations

from emulator.errors import CapabilityError
from emulator.fabric import capabilities
from emulator.model.plan import FabricPlan, wan_bdp_bytes


def check_machine(plan: FabricPlan, wan_delay: bool) -> None:
    """Refuse a fabric this machine cannot build as modelled: long-haul delay without netem, or
    delay lines whose bandwidth-delay product does not fit in memory."""
    if not (wan_delay and plan.spec.wan_paths):
        return
    if not capabilities.has_netem():
        raise CapabilityError(
            "this kernel has no sch_netem, so the 3,000 km long-haul delay cannot be emulated here; "
            "backplane refuses to build a fabric whose WAN would silently be 0 ms long",
            "run it in the delay tier's VM, whose stock kernel has netem (backplane vm run -- CMD, or "
            "sudo make demo), or bring it up without the delay, said on every line that shows a "
            "long-haul path: backplane up --no-wan-delay")
    check_wan_memory(plan, capabilities.mem_available())


# What a queued frame costs the kernel beyond its bytes (skb, page fragments): netem's delay lines
# hold the WAN's whole bandwidth-delay product in such buffers.
SKB_OVERHEAD = 2.0
# The delay lines may take at most this share of the memory the kernel says is available.
WAN_MEMORY_SHARE = 0.5


def check_wan_memory(plan: FabricPlan, available: int | None) -> None:
    """Refuse a dilation whose long-haul bandwidth-delay product (both directions of every path
    at line rate, x dilation) would not fit in memory, with the figures and the fix."""
    spec = plan.spec
    inflight = 2 * sum(wan_bdp_bytes(spec, p) for p in spec.wan_paths)
    need = SKB_OVERHEAD * inflight
    if available is None or need <= WAN_MEMORY_SHARE * available:
        return
    tm = spec.time
    fit = tm.dilation * WAN_MEMORY_SHARE * available / need
    raise CapabilityError(
        f"at {tm.name} the {len(spec.wan_paths)} long-haul paths hold {inflight / 1e9:.3g} GB in flight at line "
        f"rate ({spec.wan_paths[0].delay_s * 1e3:g} ms x {tm.dilation:g} = {tm.time(spec.wan_paths[0].delay_s):g} s "
        f"of delay each way), about {need / 1e9:.3g} GB of kernel memory with its overhead, against "
        f"{available / 1e9:.3g} GB available",
        f"lower the dilation to {fit:.3g} or less (dilation: {fit:.3g} in {spec.source}, or up --dilation {fit:.3g}), "
        "or the scale, or use fewer long-haul paths; studies of the WAN run realtime")
