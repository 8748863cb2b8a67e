"""The switches' kernel routes as netlink requests: installed with the fabric, and repointed
when the control plane withdraws a dead next hop or restores it (emulator/faults/agent.py)."""
from __future__ import annotations

import ipaddress
from typing import Any

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from emulator.errors import FabricError

MAIN_TABLE = 254


def route_request(dst: ipaddress.IPv4Network, hops: list[tuple[str, int]]) -> dict[str, Any]:
    """The netlink request for ``dst`` in the main table via ``hops``: (gateway, or "" where
    the destination is on the port's link, and the port's ifindex)."""
    kwargs: dict[str, Any] = {"dst": str(dst.network_address), "dst_len": dst.prefixlen, "table": MAIN_TABLE}
    if len(hops) == 1:
        gw, oif = hops[0]
        kwargs["oif"] = oif
        if gw:
            kwargs["gateway"] = gw
        else:
            kwargs["scope"] = 253  # link: the host is on this port
    else:
        kwargs["multipath"] = [{"gateway": gw, "oif": oif} for gw, oif in hops]
    return kwargs


def replace_route(ipr: IPRoute, where: str, dst: ipaddress.IPv4Network, hops: list[tuple[str, int]]) -> None:
    """Point ``dst`` at ``hops`` instead (a control plane's withdrawal or restore)."""
    try:
        ipr.route("replace", **route_request(dst, hops))
    except NetlinkError as e:
        raise FabricError(f"{where}: replacing route {dst} via {hops} failed: {e}") from None
