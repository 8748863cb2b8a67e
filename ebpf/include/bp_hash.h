/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The ECMP flow hash: MurmurHash3 (x86, 32-bit) over 32-bit words in host order, seeded by the
 * switch's node id so that switches at different tiers do not polarise. emulator/bpf/hashref.py
 * is the same function in Python; a test checks both agree on 10,000 packets in every mode.
 */
#ifndef BP_HASH_H
#define BP_HASH_H

#include "bp_consts.h"

static __always_inline __u32 bp_rotl32(__u32 x, __u32 r)
{
	return (x << r) | (x >> (32 - r));
}

static __always_inline __u32 bp_hash_word(__u32 h, __u32 w)
{
	w *= 0xcc9e2d51;
	w = bp_rotl32(w, 15);
	w *= 0x1b873593;
	h ^= w;
	h = bp_rotl32(h, 13);
	return h * 5 + 0xe6546b64;
}

static __always_inline __u32 bp_hash_final(__u32 h, __u32 nwords)
{
	h ^= nwords * 4;
	h ^= h >> 16;
	h *= 0x85ebca6b;
	h ^= h >> 13;
	h *= 0xc2b2ae35;
	h ^= h >> 16;
	return h;
}

/* The words each mode hashes, after the source and destination addresses. */
static __always_inline __u32 bp_flow_hash(__u32 mode, __u32 seed, __u32 saddr, __u32 daddr,
					  __u32 proto, __u32 sport, __u32 dport, __u32 dqpn,
					  __u32 psn)
{
	__u32 h = seed;

	h = bp_hash_word(h, saddr);
	h = bp_hash_word(h, daddr);
	switch (mode) {
	case BP_HASH_QPN:
		h = bp_hash_word(h, dqpn);
		return bp_hash_final(h, 3);
	case BP_HASH_QPN_PSN:
		h = bp_hash_word(h, dqpn);
		h = bp_hash_word(h, psn);
		return bp_hash_final(h, 4);
	case BP_HASH_EV:
		h = bp_hash_word(h, sport);
		return bp_hash_final(h, 3);
	default: /* BP_HASH_FIVE_TUPLE */
		h = bp_hash_word(h, proto);
		h = bp_hash_word(h, (sport << 16) | dport);
		return bp_hash_final(h, 4);
	}
}

#endif /* BP_HASH_H */
