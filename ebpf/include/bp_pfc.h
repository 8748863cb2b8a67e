/* SPDX-License-Identifier: GPL-2.0 */
/*
 * 802.1Qbb priority flow control: the frame and its parser, and the RoCEv2 UDP header whose
 * checksum field carries the ingress tag. What touches maps is in ebpf/pfc_state.c (bcc
 * rewrites map calls only in the program text, not in headers).
 */
#ifndef BP_PFC_H
#define BP_PFC_H

#include "bp_consts.h"
#include "bp_structs.h"
#include "bp_parse.h"

/* A PFC frame after its Ethernet header: opcode, class-enable vector, eight pause times. */
struct bp_pfc_frame {
	__be16 opcode;
	__be16 vector;                /* bit p: priority p's pause time is valid */
	__be16 quanta[BP_NUM_PRIO];   /* in 512 bit times of the link; 0 resumes */
};

/* Returns the MAC control opcode (host order), or BP_PARSE_TRUNCATED. */
static __always_inline int bp_parse_pfc(struct bp_cursor *c, void *data_end, struct bp_pfc_frame **pfc)
{
	struct bp_pfc_frame *h = c->pos;

	if ((void *)(h + 1) > data_end)
		return BP_PARSE_TRUNCATED;
	c->pos = h + 1;
	*pfc = h;
	return bpf_ntohs(h->opcode);
}

/*
 * The UDP header of a RoCEv2 packet (IPv4, not a fragment, UDP port 4791), whose checksum field
 * carries the ingress tag between a switch's egress and its peer; NULL for anything else.
 */
static __always_inline struct udphdr *bp_roce_udp(void *data, void *data_end)
{
	struct bp_cursor c = { .pos = data };
	struct udphdr *udph = NULL;
	struct ethhdr *eth;
	struct iphdr *iph;

	if (bp_parse_eth(&c, data_end, &eth) != ETH_P_IP)
		return NULL;
	if (bp_parse_ipv4(&c, data_end, &iph) != IPPROTO_UDP)
		return NULL;
	if (iph->frag_off & bpf_htons(BP_IP_MF | BP_IP_OFFSET))
		return NULL;
	if (bp_parse_udp(&c, data_end, &udph) != BP_ROCE_PORT)
		return NULL;
	return udph;
}

#endif /* BP_PFC_H */
