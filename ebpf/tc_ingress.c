// SPDX-License-Identifier: GPL-2.0
/*
 * tc ingress on every switch port: forwards what XDP chose. Rewrites the MACs for the next
 * hop, decrements TTL (checksum fixed) and redirects into the chosen port's egress with
 * bpf_redirect(ifindex, 0), so the packet enters that port's shaped qdisc, where it waits like
 * in a switch buffer, and meets its tc egress hook (tc_egress.c). Packets XDP left without
 * metadata take the kernel's path.
 */
#include <uapi/linux/bpf.h>
#include <uapi/linux/pkt_cls.h>

#include "bp_consts.h"
#include "bp_structs.h"
#include "bp_maps.h"
#include "bp_parse.h"
#include "bp_csum.h"

int bp_tc_ingress(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct bp_meta *meta = (void *)(long)skb->data_meta;
	struct bp_cursor c = { .pos = data };
	struct bp_counters *cnt;
	struct bp_port *port;
	struct ethhdr *eth;
	struct iphdr *iph;
	__u32 out;
	int rc = TC_ACT_OK;

	if ((void *)(meta + 1) > data || meta->magic != BP_META_MAGIC)
		goto done;
	out = meta->ifindex;
	port = bp_ports.lookup(&out);
	cnt = bp_counters.lookup(&out);
	if (!port || !cnt || !port->node_id) {
		__u32 in = skb->ifindex;

		cnt = bp_counters.lookup(&in);
		if (cnt)
			cnt->drop_no_port++;
		rc = TC_ACT_SHOT;
		goto done;
	}
	/* XDP checked these headers on the same bytes; the verifier wants it again. */
	if (bp_parse_eth(&c, data_end, &eth) != ETH_P_IP || bp_parse_ipv4(&c, data_end, &iph) < 0)
		goto done;
	__builtin_memcpy(eth->h_source, port->smac, ETH_ALEN);
	__builtin_memcpy(eth->h_dest, port->dmac, ETH_ALEN);
	bp_ip_decrease_ttl(iph);
	cnt->fwd_pkts++;
	cnt->fwd_bytes += skb->len;
	rc = bpf_redirect(out, 0);
done:
	return rc;
}
