// SPDX-License-Identifier: GPL-2.0
/*
 * tc ingress on every port of the fabric (switches, fibers, hosts): what a frame does as it
 * arrives.
 *
 * 1. Dequeue side of queue accounting: the frame just left the peer port's egress queue, so
 *    its length is added to that queue's dequeued bytes; while that queue is backlogged, the
 *    gap since the last frame is held against the frame's time at the port's rate.
 * 2. PFC: the dequeue gives a lossless packet's bytes back to the ingress port of the switch it
 *    left (tagged in its UDP checksum by tc_egress.c, cleared here), which may send XON; a PFC
 *    frame received is counted, handed to the agent that gates this port's egress, and dropped,
 *    as a MAC consumes it.
 * 3. On switch ports, RoCEv2 is forwarded: hash the fields of the configured ECMP mode, pick one
 *    of the route's next hops, rewrite the MACs for it, decrement TTL (checksum fixed) and
 *    redirect into its egress with bpf_redirect(ifindex, 0), so the packet enters that port's
 *    shaped qdisc, where it waits like in a switch buffer, and meets its tc egress hook.
 *
 * A frame that still belongs to its sender's IPv4 socket (straight from a host: a sending socket's
 * skb stays charged to its send buffer until freed) is first cloned back into this port's
 * ingress and the original consumed, before anything is counted: a kernel router's ip_rcv()
 * lets go of the socket, a redirect would not, and the sender would stay charged for every byte
 * it has anywhere in the fabric, its send buffer pacing it instead of the line and no queue
 * building behind it. The clone owns no socket and comes back a backlog round later, when it
 * no longer shares its data with the original, so writing it copies nothing.
 *
 * Everything that is not well-formed RoCEv2 over IPv4 with a route and TTL to spare takes the
 * kernel's path (ARP, ICMP, TCP, fragments) or, when its headers are broken, is dropped and
 * counted. All of it runs here, on the skb, and not in XDP: native XDP on veth copies every
 * frame that does not fit a page with headroom (a 4 KB RoCE frame) into a new buffer at every
 * hop, which cost more than the whole forwarding.
 */
#include <uapi/linux/bpf.h>
#include <uapi/linux/pkt_cls.h>

#include "bp_consts.h"
#include "bp_structs.h"
#include "bp_maps.h"
#include "bp_parse.h"
#include "bp_csum.h"
#include "bp_hash.h"
#include "bp_pfc.h"

/* The bin of a busy gap: the edges its ratio reached, with @paid = gap * rate held against
 * @unit = charged bytes * BP_PACING_NS_PER_ONE (no division; the edges ascend). */
static __always_inline __u32 bp_pacing_bin(__u64 paid, __u64 unit)
{
	__u32 bin = BP_PACING_BINS - 1;

	if (paid < BP_PACING_EDGE_8 * unit)
		bin = 8;
	if (paid < BP_PACING_EDGE_7 * unit)
		bin = 7;
	if (paid < BP_PACING_EDGE_6 * unit)
		bin = 6;
	if (paid < BP_PACING_EDGE_5 * unit)
		bin = 5;
	if (paid < BP_PACING_EDGE_4 * unit)
		bin = 4;
	if (paid < BP_PACING_EDGE_3 * unit)
		bin = 3;
	if (paid < BP_PACING_EDGE_2 * unit)
		bin = 2;
	if (paid < BP_PACING_EDGE_1 * unit)
		bin = 1;
	if (paid < BP_PACING_EDGE_0 * unit)
		bin = 0;
	return bin;
}

/*
 * Time a frame of @len bytes leaving a queue shaped to @port->peer_rate that held @depth bytes
 * with it. After a dequeue that left backlog the shaper owed this frame at once, so the gap is
 * what it charged: HTB charges a frame's time after sending it (the gap pays for the last
 * frame), TBF waits for a frame's tokens (the gap pays for this one).
 */
static __always_inline void bp_pace(struct bp_pacing *p, struct bp_port *port, __u32 len,
				    __s64 depth)
{
	__u64 now = bpf_ktime_get_ns(), gap, paid;
	__u32 charged;

	if (p->backlogged) {
		charged = (port->flags & BP_PORT_PEER_TBF) ? len : p->last_len;
		/* A racing CPU may have stamped a later dequeue: a lost gap, never a negative one. */
		gap = now > p->last_ns ? now - p->last_ns : 0;
		if (gap > BP_PACING_GAP_MAX)
			gap = BP_PACING_GAP_MAX;
		paid = gap * port->peer_rate; /* < 2^64: both factors are below 2^32 */
		p->bins[bp_pacing_bin(paid, (__u64)charged * BP_PACING_NS_PER_ONE)]++;
		p->busy_ns += gap;
		p->busy_bytes += charged;
	}
	p->last_ns = now;
	p->last_len = len;
	p->backlogged = depth > len;
}

/* Add a frame of @len bytes that left @port's peer queue to its dequeued bytes, and time it. */
static __always_inline void bp_dequeue(struct bp_port *port, __u32 prio, __u32 len)
{
	__u32 ifindex = port->peer_queue, key = ifindex * BP_QUEUE_SLOTS + prio;
	struct bp_queue *q = bp_queues.lookup(&key);
	struct bp_pacing *pace;
	__s64 depth;

	if (q) {
		__sync_fetch_and_add(&q->deq_bytes, len);
		__sync_fetch_and_add(&q->deq_pkts, 1);
	}
	key = ifindex * BP_QUEUE_SLOTS + BP_NUM_PRIO;
	q = bp_queues.lookup(&key);
	if (q) {
		/* Before this frame is counted out: the bytes it leaves behind are depth - len. */
		depth = (__s64)(q->enq_bytes - q->deq_bytes);
		__sync_fetch_and_add(&q->deq_bytes, len);
		__sync_fetch_and_add(&q->deq_pkts, 1);
		pace = port->peer_rate ? bp_pacing.lookup(&ifindex) : NULL;
		if (pace)
			bp_pace(pace, port, len, depth);
	}
}

/* A lossless packet tagged with @tag (an ingress port of the switch whose queue it left, the
 * one @port's peer_queue belongs to) gives its @len bytes back to that port's occupancy. */
static __always_inline void bp_release(struct bp_port *port, __u32 tag, __u32 prio, __u32 len)
{
	__u32 zero = 0, queue = port->peer_queue;
	struct bp_port *in_port, *out_port;
	struct bp_ingress *ingress;
	struct bp_config *cfg;

	if (tag >= BP_MAX_IFINDEX)
		return;
	in_port = bp_ports.lookup(&tag);
	out_port = bp_ports.lookup(&queue);
	cfg = bp_config.lookup(&zero);
	if (!in_port || !out_port || !cfg || in_port->node_id != out_port->node_id)
		return;
	ingress = bp_ingress_of(tag, prio);
	if (ingress)
		bp_ingress_sub(ingress, cfg, tag, prio, len);
}

/* Hand a received PFC frame to the agent: it gates this port's egress for the priorities in
 * @vector (the frame's, less those the watchdog ignores). */
static __always_inline void bp_event_pfc(__u32 ifindex, struct bp_pfc_frame *pfc, __u32 vector)
{
	struct bp_event *ev;
	int p;

	if (!vector)
		return;
	ev = bp_events.ringbuf_reserve(sizeof(*ev));
	if (!ev)
		return;
	ev->ns = bpf_ktime_get_ns();
	ev->kind = BP_EV_PFC;
	ev->ifindex = ifindex;
	ev->prio = 0;
	ev->vector = vector;
#pragma unroll
	for (p = 0; p < BP_NUM_PRIO; p++)
		ev->quanta[p] = bpf_ntohs(pfc->quanta[p]);
	bp_events.ringbuf_submit(ev, 0);
}

/*
 * Adaptive routing: a flow keeps the next hop it has while its gaps stay under the flowlet gap,
 * so new weights move only new flows and flowlets and never reorder one in flight; a flow
 * pinned to a port taken out of ECMP (BP_PORT_AVOID) moves at once (counted on @cnt).
 */
static __always_inline __u32 bp_pinned(__u32 node_id, __u32 hash, __u32 chosen, __u32 gap_ns,
				       struct bp_counters *cnt)
{
	struct bp_pin_key k = { .node_id = node_id, .hash = hash };
	struct bp_pin fresh = {}, *pin = bp_pins.lookup(&k);
	__u64 now = bpf_ktime_get_ns();
	struct bp_port *p;
	__u32 was;

	if (pin) {
		was = pin->ifindex;
		p = bp_ports.lookup(&was);
		if (now - pin->last_ns < gap_ns && p && !(p->flags & BP_PORT_AVOID)) {
			pin->last_ns = now;
			return was;
		}
		if (was != chosen)
			cnt->ar_moved++;
	}
	fresh.ifindex = chosen;
	fresh.last_ns = now;
	bp_pins.update(&k, &fresh);
	return chosen;
}

int bp_tc_ingress(struct __sk_buff *skb)
{
	void *data, *data_end;
	__u32 ifindex = skb->ifindex, len = skb->len;
	struct bp_counters *cnt, *out_cnt;
	struct bp_cursor c, mc;
	struct bp_route_key key;
	struct bp_port *port, *out_port;
	struct bp_config *cfg;
	struct bp_route *route;
	struct ethhdr *eth;
	struct iphdr *iph;
	struct udphdr *udph;
	struct bp_bth *bth;
	struct bp_pfc_frame *pfc;
	struct bpf_sock *sk;
	__u32 zero = 0, dscp, prio, *prio_p, hash, nh, out;
	int proto, rc = TC_ACT_OK;

	port = bp_ports.lookup(&ifindex);
	cnt = bp_counters.lookup(&ifindex);
	if (!port || !cnt || !port->node_id)
		goto out; /* not a port of this fabric */
	sk = skb->sk;
	if (sk)
		sk = bpf_sk_fullsock(sk);
	/* (BPF_PROG_TEST_RUN gives its skb a dummy socket of no type: those frames are not freed.) */
	if (sk && sk->family == BP_AF_INET && sk->type && (port->flags & BP_PORT_SWITCH)) {
		if (bpf_clone_redirect(skb, ifindex, BPF_F_INGRESS) == 0) {
			rc = TC_ACT_STOLEN; /* the clone is this frame now; the original frees its socket */
		} else {
			cnt->drop_nomem++;
			rc = TC_ACT_SHOT;
		}
		goto out;
	}
	/* The headers this reads must be in the skb's linear part: a sender's socket puts a whole
	 * datagram there, anything else is pulled (and the pointers taken again after). */
	data = (void *)(long)skb->data;
	data_end = (void *)(long)skb->data_end;
	if (data + BP_HEADERS_MAX > data_end && len >= BP_HEADERS_MAX) {
		bpf_skb_pull_data(skb, BP_HEADERS_MAX);
		data = (void *)(long)skb->data;
		data_end = (void *)(long)skb->data_end;
	}
	c.pos = data;
	mc.pos = data;
#ifndef BP_FORWARD_ONLY
	cnt->rx_pkts++;
	cnt->rx_bytes += len;
	dscp = bp_frame_dscp(data, data_end);
	prio_p = bp_dscp_prio.lookup(&dscp);
	prio = prio_p ? (*prio_p & (BP_NUM_PRIO - 1)) : 0;
	if (port->peer_queue) {
		bp_dequeue(port, prio, len);
		udph = bp_roce_udp(data, data_end);
		if (udph && udph->check) {
			bp_release(port, udph->check & BP_TAG_IFINDEX_MASK,
				   (udph->check >> BP_TAG_PRIO_SHIFT) & (BP_NUM_PRIO - 1), len);
			udph->check = 0;
		}
		/* A stormed queue in drop mode discards what it held as it drains. */
		if (bp_wd_drops(port->peer_queue, prio, 0, 1))
			rc = TC_ACT_SHOT;
	}
	/* ... and, in drop mode, what its port receives at that priority. */
	if (bp_wd_drops(ifindex, prio, 1, 0))
		rc = TC_ACT_SHOT;
	/* A dead port takes nothing in; what was in flight to it is lost (counted dequeued above). */
	if (port->flags & BP_PORT_DOWN) {
		cnt->drop_link_down++;
		rc = TC_ACT_SHOT;
	}
	if (rc == TC_ACT_SHOT)
		goto out;
	proto = bp_parse_eth(&mc, data_end, &eth);
	if (proto == BP_ETH_P_MAC_CONTROL) {
		if (bp_parse_pfc(&mc, data_end, &pfc) == BP_PFC_OPCODE && (port->flags & BP_PORT_PFC)) {
			bp_pfc_count(ifindex, pfc, 1);
			bp_event_pfc(ifindex, pfc, bp_wd_on_pfc(ifindex, pfc));
		} else {
			cnt->mac_control++;
		}
		rc = TC_ACT_SHOT;
		goto out;
	}
	if (proto == BP_ETH_P_KICK) {
		cnt->kicks++;
		rc = TC_ACT_SHOT;
		goto out;
	}
#endif /* BP_FORWARD_ONLY */
	if (!(port->flags & BP_PORT_SWITCH))
		goto out;

	proto = bp_parse_eth(&c, data_end, &eth);
	if (proto == BP_PARSE_TRUNCATED) {
		cnt->drop_truncated++;
		rc = TC_ACT_SHOT;
		goto out;
	}
	if (proto != ETH_P_IP)
		goto kernel;
	proto = bp_parse_ipv4(&c, data_end, &iph);
	if (proto < 0) {
		if (proto == BP_PARSE_VERSION)
			cnt->drop_ip_version++;
		else if (proto == BP_PARSE_HEADER)
			cnt->drop_ip_header++;
		else
			cnt->drop_truncated++;
		rc = TC_ACT_SHOT;
		goto out;
	}
	if (iph->frag_off & bpf_htons(BP_IP_MF | BP_IP_OFFSET)) {
		cnt->fragments++;
		goto kernel;
	}
	if (proto != IPPROTO_UDP)
		goto kernel;
	if (bp_parse_udp(&c, data_end, &udph) < 0) {
		cnt->drop_truncated++;
		rc = TC_ACT_SHOT;
		goto out;
	}
	if (udph->dest != bpf_htons(BP_ROCE_PORT))
		goto kernel;
	if (bp_parse_bth(&c, data_end, &bth) < 0) {
		cnt->drop_roce_header++;
		rc = TC_ACT_SHOT;
		goto out;
	}
	if (iph->ttl <= 1) {
		cnt->ttl_expired++;
		goto kernel;
	}
	key.prefixlen = 64;
	key.node_id = port->node_id;
	key.addr = iph->daddr;
	route = bp_routes.lookup(&key);
	if (!route || route->count == 0 || route->count > BP_MAX_NEXTHOPS) {
		cnt->no_route++;
		goto kernel;
	}
	cfg = bp_config.lookup(&zero);
	if (!cfg)
		goto kernel;
	hash = bp_flow_hash(cfg->hash_mode, port->node_id, bpf_ntohl(iph->saddr),
			    bpf_ntohl(iph->daddr), proto, bpf_ntohs(udph->source),
			    bpf_ntohs(udph->dest), bpf_ntohl(bth->qpn) & 0xffffff,
			    bpf_ntohl(bth->psn) & 0xffffff);
	nh = hash % route->count;
	if (nh >= BP_MAX_NEXTHOPS)
		goto kernel;
	out = route->ifindex[nh];
#ifdef BP_FORWARD_ONLY
	out_port = bp_ports.lookup(&out);
	if (!out_port || !out_port->node_id) {
		rc = TC_ACT_SHOT;
		goto out;
	}
#else
	if (cfg->adaptive)
		out = bp_pinned(port->node_id, hash, out, cfg->flowlet_gap_ns, cnt);
	cnt->roce_pkts++;
	out_port = bp_ports.lookup(&out);
	out_cnt = bp_counters.lookup(&out);
	if (!out_port || !out_cnt || !out_port->node_id) {
		cnt->drop_no_port++;
		rc = TC_ACT_SHOT;
		goto out;
	}
#endif /* BP_FORWARD_ONLY */
	__builtin_memcpy(eth->h_source, out_port->smac, ETH_ALEN);
	__builtin_memcpy(eth->h_dest, out_port->dmac, ETH_ALEN);
	bp_ip_decrease_ttl(iph);
#ifndef BP_FORWARD_ONLY
	out_cnt->fwd_pkts++;
	out_cnt->fwd_bytes += len;
#endif
	rc = bpf_redirect(out, 0);
	goto out;
kernel:
	cnt->kernel_pkts++;
out:
	return rc;
}
