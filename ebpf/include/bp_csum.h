/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Incremental IPv4 header checksum updates (RFC 1624), for the two fields a switch changes:
 * TTL on forwarding and ECN on marking. RoCEv2 sends UDP checksum 0 and its ICRC masks both
 * fields, so the IP header checksum is the only one to fix.
 */
#ifndef BP_CSUM_H
#define BP_CSUM_H

#include <uapi/linux/ip.h>

/* TTL - 1: the TTL/protocol word drops by 0x0100, so the checksum rises by it. */
static __always_inline void bp_ip_decrease_ttl(struct iphdr *iph)
{
	__u32 check = (__u32)iph->check;

	check += (__u32)bpf_htons(0x0100);
	iph->check = (__sum16)(check + (check >= 0xFFFF));
	iph->ttl--;
}

/* Set CE on an ECT(0) or ECT(1) packet; returns 1 if marked. */
static __always_inline int bp_ip_set_ce(struct iphdr *iph)
{
	__u32 check = (__u32)iph->check;
	__u32 ecn = (iph->tos + 1) & BP_ECN_MASK;

	/* After +1: not-ECT -> 01, ECT(1) -> 10, ECT(0) -> 11, CE -> 00. */
	if (!(ecn & 2))
		return 0;
	/* The TOS byte rises by (3 - old ECN bits); fold that into the one's complement sum. */
	check += (__u32)bpf_htons(0xFFFB) + (__u32)bpf_htons(ecn);
	iph->check = (__sum16)(check + (check >= 0xFFFF));
	iph->tos |= BP_ECN_CE;
	return 1;
}

/* Rewrite the DSCP, keeping the ECN bits: the TOS byte shares a 16-bit word with version/IHL,
 * so the checksum moves by the difference in that word (RFC 1624, eqn. 3). */
static __always_inline void bp_ip_set_dscp(struct iphdr *iph, __u32 dscp)
{
	__u16 *word = (__u16 *)iph;
	__u16 old = *word;
	__u32 check;

	iph->tos = (__u8)((dscp << 2) | (iph->tos & BP_ECN_MASK));
	check = (__u16)~iph->check;
	check += (__u16)~old + *word;
	check = (check & 0xffff) + (check >> 16);
	check = (check & 0xffff) + (check >> 16);
	iph->check = (__sum16)~check;
}

#endif /* BP_CSUM_H */
