/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Cursor-based, bounds-checked parsers for Ethernet, IPv4, UDP and the RoCEv2 BTH, after
 * xdp-tutorial's parsing_helpers.h: each takes the cursor, checks the header fits before
 * data_end, advances past it and returns what comes next (or a negative BP_PARSE_* error).
 * They work on any packet pointers (tc's skb data here).
 */
#ifndef BP_PARSE_H
#define BP_PARSE_H

#include <uapi/linux/if_ether.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/in.h>
#include <uapi/linux/udp.h>

#include "bp_consts.h"

#define BP_PARSE_TRUNCATED -1
#define BP_PARSE_VERSION -2
#define BP_PARSE_HEADER -3

/* IPv4 flags and fragment offset: any of these set means a fragment. */
#define BP_IP_MF 0x2000
#define BP_IP_OFFSET 0x1fff

/* RoCEv2 base transport header (IBTA 9.2). */
struct bp_bth {
	__u8 opcode;
	__u8 flags;      /* SE, M, PadCnt, TVer */
	__be16 pkey;
	__be32 qpn;      /* FECN, BECN, reserved; then the 24-bit destination QP */
	__be32 psn;      /* AckReq, reserved; then the 24-bit PSN */
};

struct bp_cursor {
	void *pos;
};

/* Returns the EtherType in host order, or BP_PARSE_TRUNCATED. */
static __always_inline int bp_parse_eth(struct bp_cursor *c, void *data_end, struct ethhdr **eth)
{
	struct ethhdr *h = c->pos;

	if ((void *)(h + 1) > data_end)
		return BP_PARSE_TRUNCATED;
	c->pos = h + 1;
	*eth = h;
	return bpf_ntohs(h->h_proto);
}

/* Returns the IP protocol, or a BP_PARSE_* error. Options are skipped, not refused. */
static __always_inline int bp_parse_ipv4(struct bp_cursor *c, void *data_end, struct iphdr **iph)
{
	struct iphdr *h = c->pos;
	int hdrsize;

	if ((void *)(h + 1) > data_end)
		return BP_PARSE_TRUNCATED;
	if (h->version != 4)
		return BP_PARSE_VERSION;
	hdrsize = h->ihl * 4;
	if (hdrsize < (int)sizeof(*h) || bpf_ntohs(h->tot_len) < hdrsize)
		return BP_PARSE_HEADER;
	if (c->pos + hdrsize > data_end)
		return BP_PARSE_TRUNCATED;
	c->pos += hdrsize;
	*iph = h;
	return h->protocol;
}

/* Returns the UDP destination port, or BP_PARSE_TRUNCATED. */
static __always_inline int bp_parse_udp(struct bp_cursor *c, void *data_end, struct udphdr **udph)
{
	struct udphdr *h = c->pos;

	if ((void *)(h + 1) > data_end)
		return BP_PARSE_TRUNCATED;
	c->pos = h + 1;
	*udph = h;
	return bpf_ntohs(h->dest);
}

/* Returns the BTH opcode, or BP_PARSE_TRUNCATED. */
static __always_inline int bp_parse_bth(struct bp_cursor *c, void *data_end, struct bp_bth **bth)
{
	struct bp_bth *h = c->pos;

	if ((void *)(h + 1) > data_end)
		return BP_PARSE_TRUNCATED;
	c->pos = h + 1;
	*bth = h;
	return h->opcode;
}

/*
 * The frame's DSCP, or 0 when it is not a well-formed IPv4 packet. The egress hook (enqueue)
 * and the peer's ingress hook (dequeue) both map it to a priority on the same bytes, so both
 * count the packet against the same queue.
 */
static __always_inline __u32 bp_frame_dscp(void *data, void *data_end)
{
	struct bp_cursor c = { .pos = data };
	struct ethhdr *eth;
	struct iphdr *iph;

	if (bp_parse_eth(&c, data_end, &eth) != ETH_P_IP)
		return 0;
	if (bp_parse_ipv4(&c, data_end, &iph) < 0)
		return 0;
	return iph->tos >> 2;
}

#endif /* BP_PARSE_H */
