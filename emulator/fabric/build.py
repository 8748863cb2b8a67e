"""The running fabric: Mininet nodes in named namespaces, veth links, queues and routes.

Follows Mininet's shape (nodes, interfaces and links each configure themselves) with two
departures: configuration goes over netlink (pyroute2) instead of shell commands, and every
step is read back from the kernel and raises on any difference instead of logging and carrying on.
Mininet is told it is initialised (``Mininet.inited``) so it never rewrites the host's sysctls.
"""
from __future__ import annotations

import ipaddress
import os
import pty
import resource
import select
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Mapping, Protocol

from mininet.link import Intf
from mininet.link import Link as MininetLink
from mininet.net import Mininet
from mininet.node import Node as MininetNode
from pyroute2 import IPRoute
from pyroute2.netlink import NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REQUEST
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.rtnl import RTM_NEWLINK
from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg

from emulator.errors import AlreadyRunning, BackplaneError, CapabilityError, FabricError
from emulator.fabric import capabilities, checks, netns, queues, rtnl
from emulator.model.plan import DelayLine, FabricPlan, Node as PlanNode, Port, Route

# Mininet.init() would raise rlimits and rewrite global sysctls (wmem_max, ARP cache sizes, ...)
# behind the user's back. The namespaces we build need none of it.
Mininet.inited = True

LOOPBACK_IFINDEX = 1  # a new network namespace's first device
IFF_UP = 0x1
# Descriptors a node holds open in the controller: its shell's pty (two ends) and two netlink
# sockets; a port's programs and maps are shared, so they do not count per node.
FDS_PER_NODE = 4
FDS_SPARE = 256


class FabricNode(MininetNode):
    """A Mininet node whose network namespace carries the fabric's name and prefix."""

    # Per-namespace sysctls only; the host's own are never touched.
    SYSCTLS: tuple[tuple[str, str], ...] = (
        ("net.ipv6.conf.all.disable_ipv6", "1"),  # no IPv6 chatter in counters and captures
        ("net.ipv6.conf.default.disable_ipv6", "1"),
        ("net.ipv4.conf.all.rp_filter", "0"),  # ECMP return paths differ from forward ones
        ("net.ipv4.conf.default.rp_filter", "0"),
    )

    def __init__(self, name: str, plan_node: PlanNode, plan: FabricPlan, **params: Any) -> None:
        self.plan_node = plan_node
        self.plan = plan
        self.ipr = None
        self.rtnl = None
        super().__init__(name, inNamespace=True, **params)

    def startShell(self, mnopts=None) -> None:  # noqa: N802 (Mininet's name)
        """Spawn the node's shell as Mininet's Node.startShell does, without waiting for its
        prompt: the build spawns every node's shell, then waits for each (finish_start), so
        that a thousand bash start-ups overlap instead of queueing."""
        if self.shell:
            raise FabricError(f"{self.name}: its shell is already running")
        # Mininet's command but for its `env PS1=...`: the prompt comes in the environment, one
        # exec fewer per node.
        cmd = ["mnexec", "-cdn", "bash", "--norc", "--noediting", "-is", "mininet:" + self.name]
        self.master, self.slave = pty.openpty()
        self.shell = self._popen(cmd, stdin=self.slave, stdout=self.slave, stderr=self.slave, close_fds=False,
                                 env={**os.environ, "PS1": chr(127)})
        self.stdin = os.fdopen(self.master, "r")
        self.stdout = self.stdin
        self.pid = self.shell.pid
        self.pollOut = select.poll()
        self.pollOut.register(self.stdout)
        self.outToNode[self.stdout.fileno()] = self
        self.inToNode[self.stdin.fileno()] = self
        self.execed = False
        self.lastCmd = None
        self.lastPid = None
        self.readbuf = ""
        # Mininet's first command (no history file, no echo, no job notices), typed ahead: bash
        # reads it once it is up, and finish_start reads the prompt that follows it.
        self.write("unset HISTFILE; stty -echo; set +m\n")
        self.waiting = True

    def finish_start(self) -> None:
        """Wait for the shell's prompt after its first command (it is then in its own
        namespace), name the namespace, open the node's netlink sockets and set its sysctls
        and loopback."""
        prompts = 0
        while prompts < 2:  # the first prompt, then the one after the typed-ahead command
            data = self.read(1024)
            prompts += data.count(chr(127))
            if not data and self.shell.poll() is not None:
                raise FabricError(f"{self.name}: its shell exited ({self.shell.returncode}) before its prompt")
            if prompts < 2:
                self.pollOut.poll()
        self.waiting = False
        netns.attach(self.name, self.pid)
        with netns.entered(self.name):
            self.ipr = IPRoute()
            self.rtnl = rtnl.socket_here()
            netns.write_sysctls_here(self.SYSCTLS)
        try:
            rtnl.request_all(self.rtnl, [rtnl.link_up_message(LOOPBACK_IFINDEX)], ["bringing lo up"])
        except rtnl.RtnlError as e:
            raise FabricError(f"{self.name}: {e}") from None

    def check_ports(self) -> None:
        """Read the node's links, addresses and queues back in one dump each and compare every
        port with what was asked of it: name at its ifindex, MTU, up, address, egress queue."""
        links = {l["index"]: l for l in self.ipr.get_links()}
        lo = links.get(LOOPBACK_IFINDEX)
        if lo is None or lo.get_attr("IFLA_IFNAME") != "lo" or not lo["flags"] & IFF_UP:
            raise FabricError(f"{self.name}: loopback is not up at ifindex {LOOPBACK_IFINDEX}")
        addrs: dict[int, set] = {}
        for a in self.ipr.get_addr(family=socket.AF_INET):
            addrs.setdefault(a["index"], set()).add((a.get_attr("IFA_ADDRESS"), a["prefixlen"]))
        qdiscs: dict[int, list] = {}
        for q in self.ipr.get_qdiscs():
            qdiscs.setdefault(q["index"], []).append(q)
        for intf in self.intfList():
            port = getattr(intf, "plan_port", None)
            if port is None:
                continue
            where = f"{self.name}:{intf.name}"
            link = links.get(port.ifindex)
            if link is None or link.get_attr("IFLA_IFNAME") != intf.name:
                raise FabricError(f"{where}: not at ifindex {port.ifindex} "
                                  f"(the kernel has {link.get_attr('IFLA_IFNAME') if link else 'nothing'} there)")
            if link.get_attr("IFLA_MTU") != intf.mtu:
                raise FabricError(f"{where}: MTU is {link.get_attr('IFLA_MTU')}, expected {intf.mtu}")
            if not link["flags"] & IFF_UP:
                raise FabricError(f"{where}: the port is down after bringing it up")
            if port.address is not None:
                want = (str(port.address.ip), port.address.network.prefixlen)
                if want not in addrs.get(port.ifindex, set()):
                    raise FabricError(f"{where}: address {port.address} missing after adding it")
            if intf.egress is not None:
                queues.check(self.ipr, port.ifindex, intf.egress, where, intf.intra_delay,
                             qdiscs.get(port.ifindex, []))

    def configure(self, plan: FabricPlan) -> None:
        """Role-specific set-up once all links exist."""

    def terminate(self) -> None:
        if self.ipr is not None:
            self.ipr.close()
            self.ipr = None
        if self.rtnl is not None:
            self.rtnl.close()
            self.rtnl = None
        super().terminate()


class HostNode(FabricNode):
    """A GPU server: one NIC, a default route to its leaf."""

    def configure(self, plan: FabricPlan) -> None:
        install_routes(self, plan.routes[self.plan_node.name])


class RouterNode(FabricNode):
    """A leaf, spine or border switch: a Linux IP router, no Open vSwitch, no controller."""

    SYSCTLS = FabricNode.SYSCTLS + (
        ("net.ipv4.ip_forward", "1"),
        # Kernel ECMP hashes the five-tuple: the baseline the eBPF datapath replaces.
        ("net.ipv4.fib_multipath_hash_policy", "1"),
    )

    def configure(self, plan: FabricPlan) -> None:
        for port in plan.ports(self.plan_node.name):
            if port.address is not None and port.address.network.prefixlen == 32:
                # A leaf's host ports are unnumbered (/32 gateway, /32 route per host): answer
                # ARP for the host's neighbours in its /24 so that they too go through the leaf.
                key = f"net.ipv4.conf.{port.ifname}.proxy_arp"
                netns.write_sysctl(self.name, key, "1")
                if netns.read_sysctl(self.name, key) != "1":
                    raise FabricError(f"{self.name}: {key} did not take")
            if plan.node(port.peer_node).role == "fiber":
                self._pin_neighbour(port, plan.next_hop(port))
        install_routes(self, plan.routes[self.plan_node.name])

    def _pin_neighbour(self, port: Port, far: Port) -> None:
        # ARP gives up after three probes a second apart, and a fiber's round trip as dilated
        # is longer than that (6 s at d = 200): the far border's MAC is planned, so pin it.
        where = f"{self.name}:{port.ifname}"
        index = self.ipr.link_lookup(ifname=port.ifname)[0]
        try:
            self.ipr.neigh("replace", dst=str(far.address.ip), lladdr=far.mac, ifindex=index,
                           state="permanent")
        except NetlinkError as e:
            raise FabricError(f"{where}: pinning neighbour {far.address.ip} ({far.mac}) failed: {e}") from None
        have = {(n.get_attr("NDA_DST"), n.get_attr("NDA_LLADDR")) for n in self.ipr.get_neighbours(ifindex=index)}
        if (str(far.address.ip), far.mac) not in have:
            raise FabricError(f"{where}: neighbour {far.address.ip} ({far.mac}) missing after pinning it")


class FiberNode(FabricNode):
    """A long-haul path: a bridge between its two ports whose egresses hold the delay line."""

    def configure(self, plan: FabricPlan) -> None:
        ipr = self.ipr
        try:
            ipr.link("add", ifname="br0", kind="bridge", br_stp_state=0, br_forward_delay=0)
            br = ipr.link_lookup(ifname="br0")[0]
            for port in plan.ports(self.plan_node.name):
                ipr.link("set", index=ipr.link_lookup(ifname=port.ifname)[0], master=br)
            ipr.link("set", index=br, state="up", mtu=plan.spec.mtu)
        except NetlinkError as e:
            raise FabricError(f"{self.name}: building the fiber's bridge failed: {e}") from None
        enslaved = {l.get_attr("IFLA_IFNAME") for l in ipr.get_links() if l.get_attr("IFLA_MASTER") == br}
        want = {p.ifname for p in plan.ports(self.plan_node.name)}
        if enslaved != want:
            raise FabricError(f"{self.name}: bridge br0 holds {sorted(enslaved)}, expected {sorted(want)}")


ROLE_CLASSES = {"host": HostNode, "leaf": RouterNode, "spine": RouterNode, "border": RouterNode,
                "fiber": FiberNode}


class PortIntf(Intf):
    """A fabric port: MTU, address and egress queue set over netlink, each checked."""

    def config(self, plan_port: Port | None = None, mtu: int = 1500, wan_delay: bool = True,
               intra_delay: bool = False, **_: Any) -> dict:
        """Address and egress queue; the link was made up at its MTU (FabricLink). What took is
        read back for the whole node at once (FabricNode.check_ports)."""
        if plan_port is None:
            return {}
        self.plan_port = plan_port
        self.mtu = mtu
        self.intra_delay = intra_delay
        where = f"{self.node.name}:{self.name}"
        index = plan_port.ifindex
        requests = []  # (message, what it does), sent in one batch
        if plan_port.address is not None:
            addr = plan_port.address
            requests.append((rtnl.addr_message(index, addr), f"adding address {addr}"))
            self.ip, self.prefixLen = str(addr.ip), addr.network.prefixlen
        egress = plan_port.egress
        if isinstance(egress, DelayLine) and not wan_delay:
            egress = None
        self.egress = egress
        if egress is not None:
            queues.install(self.node.ipr, index, egress, mtu, where, with_delay=intra_delay, check=False,
                           sock=self.node.rtnl, before=requests)
        elif requests:
            try:
                rtnl.request_all(self.node.rtnl, [m for m, _ in requests], [w for _, w in requests])
            except rtnl.RtnlError as e:
                raise FabricError(f"{where}: {e}") from None
        return {}


class FabricLink(MininetLink):
    """A veth pair made over netlink straight into both nodes' namespaces, at the plan's ifindexes."""

    def makeIntfPair(self, intfname1, intfname2, addr1=None, addr2=None, node1=None, node2=None,  # noqa: N802
                     deleteIntfs=True):
        plan = node1.plan
        index1 = plan.port(node1.plan_node.name, intfname1).ifindex
        index2 = plan.port(node2.plan_node.name, intfname2).ifindex
        # pyroute2's link("add") cannot give the peer an ifindex; the kernel takes it from the
        # ifinfomsg nested in VETH_INFO_PEER, so the request is built by hand.
        fd = os.open(netns.path(node2.name), os.O_RDONLY)
        try:
            # Both ends get the fabric's MTU in the same request, and the first end comes up
            # with it; the peer cannot (veth opens a device only once it has its peer), so it
            # is brought up after.
            mtu = plan.spec.mtu
            msg = ifinfmsg()
            msg["index"], msg["flags"], msg["change"] = index1, IFF_UP, IFF_UP
            peer = {"index": index2,
                    "attrs": [("IFLA_IFNAME", intfname2), ("IFLA_ADDRESS", addr2), ("IFLA_MTU", mtu),
                              ("IFLA_NET_NS_FD", fd)]}
            msg["attrs"] = [("IFLA_IFNAME", intfname1), ("IFLA_ADDRESS", addr1), ("IFLA_MTU", mtu),
                            ("IFLA_LINKINFO", {"attrs": [("IFLA_INFO_KIND", "veth"),
                                                         ("IFLA_INFO_DATA", {"attrs": [("VETH_INFO_PEER", peer)]})]})]
            node1.ipr.nlm_request(msg, RTM_NEWLINK, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL)
            rtnl.request_all(node2.rtnl, [rtnl.link_up_message(index2)], [f"bringing {node2.name}:{intfname2} up"])
        except (NetlinkError, rtnl.RtnlError) as e:
            raise FabricError(f"creating veth {node1.name}:{intfname1} <-> {node2.name}:{intfname2} "
                              f"(ifindex {index1}/{index2}) failed: {e}") from None
        finally:
            os.close(fd)
        return None, None


def install_routes(node: FabricNode, routes: tuple[Route, ...]) -> None:
    """Install ``routes`` in the node's main table, then read the table back and compare."""
    index = {p.ifname: p.ifindex for p in node.plan.ports(node.plan_node.name)}
    adds = [rtnl.RouteAdd(r.dst, tuple((gw, index[dev]) for gw, dev in r.nexthops)) for r in routes]
    try:
        rtnl.add_routes(node.rtnl, adds)
    except rtnl.RtnlError as e:
        raise FabricError(f"{node.name}: {e}") from None
    have = read_routes(node)
    by_index = {v: k for k, v in index.items()}
    for route in routes:
        want = {(gw, dev) for gw, dev in route.nexthops}
        got = {(gw, by_index.get(oif, "?")) for gw, oif in have.get(route.dst, set())}
        if got != want:
            raise FabricError(f"{node.name}: route {route.dst} has next hops {sorted(got)} in the kernel, "
                              f"expected {sorted(want)}")


def read_routes(node: FabricNode) -> dict[ipaddress.IPv4Network, set[tuple[str, int]]]:
    """The node's main IPv4 table: destination -> {(gateway or "", oif)}."""
    try:
        return rtnl.main_routes(node.rtnl)
    except rtnl.RtnlError as e:
        raise FabricError(f"{node.name}: {e}") from None


class DatapathBuilder(Protocol):
    """Builds the switches' datapath (emulator.bpf.install is one)."""

    def load(self, plan: FabricPlan, loss_in_ebpf: bool) -> Any:
        """Compile and load the programs and program their maps from the plan (it needs nothing
        of the fabric, so it runs beside the build); ``loss_in_ebpf``: the long-haul loss is
        applied there. Returns a handle with close()."""

    def finish(self, datapath: Any, plan: FabricPlan, iproutes: Mapping[str, IPRoute]) -> None:
        """Attach what load() returned to the built fabric (each node's IPRoute)."""


class Fabric:
    """Builds a FabricPlan on the kernel and tears it down again, completely."""

    def __init__(self, plan: FabricPlan, wan_delay: bool = True,
                 datapath_builder: DatapathBuilder | None = None) -> None:
        self.plan = plan
        # The switches' datapath is built by the layer above (bpf.install.build), handed in.
        self.datapath_builder = datapath_builder
        self.wan_delay = wan_delay and bool(plan.spec.wan_paths)
        # The in-DC latency, dilated, held by a netem on each host's egress where the kernel has
        # netem; elsewhere status reports the in-DC RTT the emulator itself gives instead.
        self.intra_delay = plan.intra_delay_applies(capabilities.has_netem())
        self.net: Mininet | None = None
        self.nodes: dict[str, FabricNode] = {}
        self.up_seconds: float | None = None
        # Seconds each stage of the last start() took: nodes, links, configure, then the wait for the
        # datapath's compile (it runs beside those) and its attach.
        self.phases: dict[str, float] = {}
        self.datapath: Any = None  # what datapath_builder returned, closed on stop()

    def check_can_start(self) -> None:
        left = netns.names(self.plan.prefix)
        if left:
            raise AlreadyRunning(
                f"fabric {self.plan.name!r} already has {len(left)} namespaces ({left[0]}, ...): "
                f"it is up, or was left by a crash; backplane down --name {self.plan.name} "
                f"(or backplane clean --name {self.plan.name})"
            )
        checks.check_machine(self.plan, self.wan_delay)

    def start(self) -> None:
        """Build everything; on any failure remove what was built and raise."""
        started = time.monotonic()
        self.check_can_start()
        self._check_loss_can_be_applied()
        try:
            self._build()
        except BaseException as e:
            try:
                self.stop()
            except BackplaneError:
                pass
            if isinstance(e, (BackplaneError, KeyboardInterrupt)):
                raise
            raise FabricError(f"building fabric {self.plan.name!r} failed: {e}") from e
        self.up_seconds = time.monotonic() - started

    def _check_loss_can_be_applied(self) -> None:
        lossy = [p.index for p in self.plan.spec.wan_paths if p.loss or p.corruption]
        if lossy and not self.wan_delay and (self.plan.spec.ecmp.datapath != "ebpf"
                                             or any(p.corruption for p in self.plan.spec.wan_paths)):
            raise CapabilityError(
                f"long-haul paths {lossy} are configured lossy or corrupting, but without delay lines "
                "(netem) only the eBPF datapath can drop packets, and nothing here can corrupt them",
                "run with netem (the delay tier's VM: backplane vm run -- CMD), or set ecmp.datapath: ebpf "
                "and leave corruption at 0")

    def _build(self) -> None:
        plan = self.plan
        self.phases = {}
        mark = time.monotonic()

        def stage(name: str) -> None:
            nonlocal mark
            now = time.monotonic()
            self.phases[name] = now - mark
            mark = now

        ebpf = plan.spec.ecmp.datapath == "ebpf"
        if ebpf and self.datapath_builder is None:
            raise FabricError("the topology's switches run the eBPF datapath (ecmp.datapath: ebpf), "
                              "but this fabric was given nothing to build it with")
        _enough_descriptors(len(plan.nodes))
        with ThreadPoolExecutor(1, thread_name_prefix="bp-datapath") as compiler:
            # Without delay lines (no netem) the long-haul paths' loss is applied by the borders'
            # egress program instead, so a lossy path stays lossy.
            loading = compiler.submit(self.datapath_builder.load, plan, not self.wan_delay) if ebpf else None
            try:
                self._build_nodes(stage)
            except BaseException:
                if loading is not None:  # kept, so that stop() frees it
                    try:
                        self.datapath = loading.result()
                    except BaseException:  # noqa: BLE001 - the build's own failure is the one to report
                        pass
                raise
            if loading is not None:
                self.datapath = loading.result()
        if ebpf:
            stage("datapath load wait")
            self.datapath_builder.finish(self.datapath, plan, {name: node.ipr for name, node in self.nodes.items()})
            stage("datapath attach")

    def _build_nodes(self, stage) -> None:
        plan = self.plan
        self.net = Mininet(topo=None, build=False, controller=None, link=FabricLink, intf=PortIntf)
        for n in plan.nodes:
            cls = ROLE_CLASSES[n.role]
            self.nodes[n.name] = self.net.addHost(plan.netns(n.name), cls=cls, plan_node=n, plan=plan)
        for node in self.nodes.values():
            node.finish_start()
        stage("nodes")
        for link in plan.links:
            a, b = link.a, link.b
            common = {"mtu": plan.spec.mtu, "wan_delay": self.wan_delay, "intra_delay": self.intra_delay}
            self.net.addLink(self.nodes[a.node], self.nodes[b.node], intfName1=a.ifname, intfName2=b.ifname,
                             addr1=a.mac, addr2=b.mac, params1={"plan_port": a, **common},
                             params2={"plan_port": b, **common})
        stage("links")
        for n in plan.nodes:
            self.nodes[n.name].check_ports()
            self.nodes[n.name].configure(plan)
        stage("configure")

    def stop(self) -> None:
        """Remove every process, namespace and link of this fabric; raise if any is left."""
        for node in self.nodes.values():
            try:
                node.terminate()
            except Exception:  # noqa: BLE001 - a dead shell must not stop the teardown
                pass
        self.nodes = {}
        self.net = None
        remove_fabric_namespaces(self.plan.prefix)
        if self.datapath is not None:
            # The programs left the kernel's ports with the namespaces; this frees them and the maps.
            self.datapath.close()
            self.datapath = None


def _enough_descriptors(nodes: int) -> None:
    """Raise this process's open-file limit to what ``nodes`` need, within its hard limit (a
    per-process limit, not a global setting); raise if the hard limit is too low."""
    need = nodes * FDS_PER_NODE + FDS_SPARE
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= need or soft == resource.RLIM_INFINITY:
        return
    if hard != resource.RLIM_INFINITY and hard < need:
        raise CapabilityError(f"a fabric of {nodes} nodes holds about {need} descriptors open, and this "
                              f"process may open only {hard}",
                              f"ulimit -n {need} (or raise nofile in /etc/security/limits.conf), then retry")
    resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))


def remove_fabric_namespaces(prefix: str) -> list[str]:
    """Kill every process living in a namespace of ``prefix`` and remove the namespaces."""
    names = netns.names(prefix)
    pids = netns.pids_in(names)
    netns.kill_pids(list(pids))
    for name in names:
        netns.remove(name)
    left = netns.names(prefix)
    if left:
        raise FabricError(f"namespaces still present after removing them: {left}")
    return names
