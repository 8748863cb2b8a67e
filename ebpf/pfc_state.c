// SPDX-License-Identifier: GPL-2.0
/*
 * PFC state shared by the switch programs (no program here): the per-(port, priority) ingress
 * accounting that decides XOFF and XON, the PFC counters, and the events that hand both to the
 * agent in user space, which sends the PAUSE frames and works the egress pause gates
 * (emulator/bpf/pfc.py). A .c joined ahead of the programs, not a header, because bcc rewrites
 * map calls (bp_ingress.lookup, bp_events.ringbuf_reserve) only in the program text.
 */
#include <uapi/linux/bpf.h>

#include "bp_consts.h"
#include "bp_structs.h"
#include "bp_maps.h"
#include "bp_pfc.h"

static __always_inline int bp_lossless(struct bp_config *cfg, __u32 prio)
{
	return (cfg->lossless >> (prio & (BP_NUM_PRIO - 1))) & 1;
}

static __always_inline struct bp_ingress *bp_ingress_of(__u32 ifindex, __u32 prio)
{
	__u32 key = ifindex * BP_NUM_PRIO + (prio & (BP_NUM_PRIO - 1));

	return bp_ingress.lookup(&key);
}

static __always_inline struct bp_pfc_counters *bp_pfc_of(__u32 ifindex, __u32 prio)
{
	__u32 key = ifindex * BP_NUM_PRIO + (prio & (BP_NUM_PRIO - 1));

	return bp_pfc.lookup(&key);
}

static __always_inline void bp_event_xon_xoff(__u32 kind, __u32 ifindex, __u32 prio)
{
	struct bp_event *ev = bp_events.ringbuf_reserve(sizeof(*ev));

	if (!ev)
		return; /* the agent's refresh reads the state again: nothing is lost for good */
	__builtin_memset(ev, 0, sizeof(*ev));
	ev->ns = bpf_ktime_get_ns();
	ev->kind = kind;
	ev->ifindex = ifindex;
	ev->prio = prio;
	bp_events.ringbuf_submit(ev, 0);
}

/* @len bytes of @prio came in on @ifindex and were let into an egress queue. */
static __always_inline void bp_ingress_add(struct bp_ingress *in, struct bp_config *cfg, __u32 ifindex,
					   __u32 prio, __u32 len)
{
	__s64 now = (__s64)__sync_fetch_and_add(&in->bytes, len) + len;

	if (now > (__s64)in->max_bytes)
		in->max_bytes = now;
	if (now >= cfg->xoff && !in->paused) {
		in->paused = 1;
		bp_event_xon_xoff(BP_EV_XOFF, ifindex, prio);
	}
}

/* @len bytes of @prio that came in on @ifindex left the switch. */
static __always_inline void bp_ingress_sub(struct bp_ingress *in, struct bp_config *cfg, __u32 ifindex,
					   __u32 prio, __u32 len)
{
	__s64 now = (__s64)__sync_fetch_and_add(&in->bytes, -(__s64)len) - len;

	if (now < (__s64)cfg->xon && in->paused) {
		in->paused = 0;
		bp_event_xon_xoff(BP_EV_XON, ifindex, prio);
	}
}

/* Count a PFC frame sent (@rx 0) or received (@rx 1) on @ifindex, per priority it enables. */
static __always_inline void bp_pfc_count(__u32 ifindex, struct bp_pfc_frame *pfc, int rx)
{
	__u32 vector = bpf_ntohs(pfc->vector);
	struct bp_pfc_counters *c;
	int p;

#pragma unroll
	for (p = 0; p < BP_NUM_PRIO; p++) {
		if (!((vector >> p) & 1))
			continue;
		c = bp_pfc_of(ifindex, p);
		if (!c)
			continue;
		if (rx && pfc->quanta[p])
			c->rx_pause++;
		else if (rx)
			c->rx_resume++;
		else if (pfc->quanta[p])
			c->tx_pause++;
		else
			c->tx_resume++;
	}
}
