// SPDX-License-Identifier: GPL-2.0
/*
 * tc egress on every switch port (and, with PFC, on hosts' ports): the enqueue side of the
 * port's queue. Runs before the shaped qdisc takes the packet. Depth = bytes let in here - bytes
 * the peer's ingress saw leave (tc_ingress.c). Against that true depth it
 *   - tail-drops at the port's buffer (the qdisc's own limit is set above it, so the qdisc
 *     never drops and the accounting stays exact),
 *   - marks CE on ECT packets with WRED between kmin and kmax (probability up to pmax, every
 *     packet at kmax and above, as DCQCN's switches do), fixing the IP checksum,
 * and records the deepest queue it has seen. On a border's port towards a long-haul path it
 * also drops with the path's configured loss when no netem delay line applies it.
 *
 * With PFC, a lossless packet that came in by a PFC port is never tail-dropped: it counts
 * against that port's ingress occupancy at its priority (crossing XOFF tells the agent to send
 * PAUSE upstream), and is dropped only when the port's headroom is spent, which means PFC
 * reacted too late. The ingress port rides to the dequeue side in the UDP checksum field.
 * Every packet is steered to its priority's HTB leaf (skb->priority), PAUSE frames to the
 * control class that is never paused; PFC frames sent are counted here. With Tagger, a lossless
 * packet that bounces (in by an up port, out by an up port) moves to the second lossless
 * priority (its DSCP rewritten); it still counts against its ingress at the priority it came in at.
 * A queue the PFC watchdog declared stormed in drop mode takes nothing in.
 */
#include <uapi/linux/bpf.h>
#include <uapi/linux/pkt_cls.h>

#include "bp_consts.h"
#include "bp_structs.h"
#include "bp_maps.h"
#include "bp_parse.h"
#include "bp_csum.h"
#include "bp_pfc.h"

/* Mark with WRED's probability at @depth bytes: 0 up to kmin, rising to pmax, 1 from kmax. */
static __always_inline int bp_wred_mark(struct bp_config *cfg, __u64 depth)
{
	__u64 p;

	if (depth <= cfg->kmin)
		return 0;
	if (depth >= cfg->kmax)
		return 1;
	p = (__u64)cfg->pmax * (depth - cfg->kmin) / (cfg->kmax - cfg->kmin);
	return (bpf_get_prandom_u32() % BP_PROB_ONE) < p;
}

static __always_inline void bp_enqueue(struct bp_queue *q, __u32 len, __u64 depth)
{
	__sync_fetch_and_add(&q->enq_bytes, len);
	__sync_fetch_and_add(&q->enq_pkts, 1);
	if (depth + len > q->max_depth)
		q->max_depth = depth + len;
}

int bp_tc_egress(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	__u32 ifindex = skb->ifindex, len = skb->len, zero = 0, dscp, prio, *prio_p, key;
	__u32 in_ifindex = skb->ingress_ifindex, tag = 0, in_prio, tagged = 0;
	struct bp_cursor c = { .pos = data };
	struct bp_ingress *ingress = NULL;
	struct bp_pfc_counters *pfc_cnt;
	struct bp_port *port, *in_port;
	struct bp_pfc_frame *pfc;
	struct bp_queue *total, *q;
	struct bp_counters *cnt;
	struct bp_config *cfg;
	struct udphdr *udph;
	struct ethhdr *eth;
	struct iphdr *iph;
	__s64 depth, pdepth;
	int proto, control = 0, rc = TC_ACT_OK;

#ifdef BP_FORWARD_ONLY
	return rc; /* the floor of a datapath: the hook's call and nothing in it */
#endif
	port = bp_ports.lookup(&ifindex);
	cfg = bp_config.lookup(&zero);
	if (!port || !cfg)
		goto done;
	proto = bp_parse_eth(&c, data_end, &eth);
	if (proto == BP_ETH_P_MAC_CONTROL || proto == BP_ETH_P_KICK) {
		control = 1;
		if (proto == BP_ETH_P_MAC_CONTROL && bp_parse_pfc(&c, data_end, &pfc) == BP_PFC_OPCODE)
			bp_pfc_count(ifindex, pfc, 0);
	}
	dscp = bp_frame_dscp(data, data_end);
	prio_p = bp_dscp_prio.lookup(&dscp);
	prio = prio_p ? (*prio_p & (BP_NUM_PRIO - 1)) : 0;
	in_port = NULL;
	if (!control && in_ifindex && in_ifindex < BP_MAX_IFINDEX) {
		in_port = bp_ports.lookup(&in_ifindex);
		if (in_port && in_port->node_id != port->node_id)
			in_port = NULL; /* not forwarded by this switch */
	}
	in_prio = prio;
	/* Tagger: down from a higher tier and up again is a bounce; move it to its own lossless
	 * priority, so no cycle of paused queues can close through it. */
	c.pos = data;
	if (in_port && cfg->tagger_dscp && prio != cfg->tagger_prio && bp_lossless(cfg, prio) &&
	    (port->flags & BP_PORT_UP) && (in_port->flags & BP_PORT_UP) &&
	    bp_parse_eth(&c, data_end, &eth) == ETH_P_IP && bp_parse_ipv4(&c, data_end, &iph) >= 0) {
		bp_ip_set_dscp(iph, cfg->tagger_dscp);
		prio = cfg->tagger_prio & (BP_NUM_PRIO - 1);
		tagged = 1;
	}
	if (port->flags & BP_PORT_PRIO_QUEUES)
		skb->priority = (BP_TC_MAJOR << 16) | (control ? BP_TC_CONTROL : BP_TC_LEAF_BASE + prio);
	cnt = bp_counters.lookup(&ifindex);
	if (!cnt || !(port->flags & BP_PORT_SWITCH))
		goto done;
	if (port->flags & BP_PORT_DOWN) {
		cnt->drop_link_down++;
		rc = TC_ACT_SHOT; /* a dead link sends nothing, PFC frames included */
		goto done;
	}
	if (tagged)
		cnt->tagged++;
	key = ifindex * BP_QUEUE_SLOTS + BP_NUM_PRIO;
	total = bp_queues.lookup(&key);
	key = ifindex * BP_QUEUE_SLOTS + prio;
	q = bp_queues.lookup(&key);
	if (!total || !q)
		goto done;
	/* Signed: a frame counted out before the hooks were all attached must not wrap. */
	depth = (__s64)(total->enq_bytes - total->deq_bytes);
	if (depth < 0)
		depth = 0;
	pdepth = (__s64)(q->enq_bytes - q->deq_bytes);
	if (pdepth < 0)
		pdepth = 0;
	if (control)
		goto admit; /* MAC control is never dropped, and never marked */
	if (bp_wd_drops(ifindex, prio, 0, 0)) {
		rc = TC_ACT_SHOT; /* a stormed queue in drop mode takes nothing in */
		goto done;
	}
	if (port->loss && bpf_get_prandom_u32() < port->loss) {
		cnt->drop_loss++;
		rc = TC_ACT_SHOT;
		goto done;
	}
	udph = bp_roce_udp(data, data_end);
	if (udph && in_port && bp_lossless(cfg, in_prio) && (in_port->flags & BP_PORT_PFC))
		ingress = bp_ingress_of(in_ifindex, in_prio);
	if (ingress && in_port) {
		/* Lossless: what limits it is the ingress port's XOFF plus headroom, not this buffer. */
		if ((__s64)ingress->bytes + len > (__s64)cfg->xoff + in_port->headroom) {
			pfc_cnt = bp_pfc_of(in_ifindex, in_prio);
			if (pfc_cnt)
				pfc_cnt->drop_headroom++;
			rc = TC_ACT_SHOT;
			goto done;
		}
		tag = in_ifindex | (in_prio << BP_TAG_PRIO_SHIFT);
	} else if (depth + len > port->buffer) {
		cnt->drop_buffer++;
		rc = TC_ACT_SHOT;
		goto done;
	}
	if (udph)
		udph->check = tag; /* 0 unless the dequeue side must give bytes back to an ingress */
	c.pos = data;
	if (bp_parse_eth(&c, data_end, &eth) == ETH_P_IP &&
	    bp_parse_ipv4(&c, data_end, &iph) >= 0 &&
	    (iph->tos & BP_ECN_MASK) && (iph->tos & BP_ECN_MASK) != BP_ECN_CE &&
	    bp_wred_mark(cfg, depth) && bp_ip_set_ce(iph))
		cnt->ecn_marks++;
admit:
	bp_enqueue(total, len, depth);
	bp_enqueue(q, len, pdepth);
	if (ingress)
		bp_ingress_add(ingress, cfg, in_ifindex, in_prio, len);
	cnt->tx_pkts++;
	cnt->tx_bytes += len;
done:
	return rc;
}
