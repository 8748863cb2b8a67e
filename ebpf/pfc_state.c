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

static __always_inline struct bp_wd *bp_wd_of(__u32 ifindex, __u32 prio)
{
	__u32 key = ifindex * BP_NUM_PRIO + (prio & (BP_NUM_PRIO - 1));

	return bp_wd.lookup(&key);
}

/*
 * The watchdog's view of a PFC frame received on @ifindex: stamp each priority it pauses (the
 * agent restores a storm after restoration_time without one) and return the vector to obey,
 * without the stormed queues whose action ignores PAUSE.
 */
static __always_inline __u32 bp_wd_on_pfc(__u32 ifindex, struct bp_pfc_frame *pfc)
{
	__u32 vector = bpf_ntohs(pfc->vector), obey = vector;
	struct bp_pfc_counters *c;
	struct bp_wd *wd;
	__u64 now = bpf_ktime_get_ns();
	int p;

#pragma unroll
	for (p = 0; p < BP_NUM_PRIO; p++) {
		if (!((vector >> p) & 1) || !pfc->quanta[p])
			continue;
		wd = bp_wd_of(ifindex, p);
		if (!wd)
			continue;
		wd->last_pause_ns = now;
		if (wd->stormed && wd->action != BP_WD_ALERT) {
			obey &= ~(1U << p);
			c = bp_pfc_of(ifindex, p);
			if (c)
				c->pause_ignored++;
		}
	}
	return obey;
}

/* The watchdog on a packet of @prio at port @ifindex: 1 if a stormed queue in drop mode takes
 * it (counted as @rx or tx drop), else 0 (counted as OK while stormed). */
static __always_inline int bp_wd_drops(__u32 ifindex, __u32 prio, int rx, int count_ok)
{
	struct bp_wd *wd = bp_wd_of(ifindex, prio);
	struct bp_pfc_counters *c;

	if (!wd || !wd->stormed)
		return 0;
	c = bp_pfc_of(ifindex, prio);
	if (wd->action == BP_WD_DROP) {
		if (c && rx)
			c->wd_rx_drop++;
		else if (c)
			c->wd_tx_drop++;
		return 1;
	}
	if (c && rx)
		c->wd_rx_ok++;
	else if (c && count_ok)
		c->wd_tx_ok++;
	return 0;
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
