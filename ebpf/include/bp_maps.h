/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The maps every switch program shares. bcc compiles the programs once per controller, so one
 * set of maps serves every port of every switch in every namespace; ports are told apart by
 * ifindexes the fabric plan makes unique. User space writes ports, config, priorities and
 * routes; the kernel only looks them up.
 */
#ifndef BP_MAPS_H
#define BP_MAPS_H

#include "bp_structs.h"

/* ifindex -> port: who it belongs to, whose queue drains into it, where it forwards to. */
BPF_ARRAY(bp_ports, struct bp_port, BP_MAX_IFINDEX);
/* Slot 0: hash mode and WRED thresholds. */
BPF_ARRAY(bp_config, struct bp_config, 1);
/* DSCP -> priority, as the fabric's QoS policy assigns them (RoCE data, CNP, lossy). */
BPF_ARRAY(bp_dscp_prio, __u32, 64);
/* Destination prefix -> equal-cost egress ports, from the topology's shortest paths. */
BPF_LPM_TRIE(bp_routes, struct bp_route_key, struct bp_route, BP_MAX_ROUTES);
/* ifindex * BP_QUEUE_SLOTS + priority (or BP_NUM_PRIO for the port) -> queue accounting.
 * Shared, not per CPU: enqueue and dequeue run on different CPUs and must meet. */
BPF_ARRAY(bp_queues, struct bp_queue, BP_MAX_IFINDEX * BP_QUEUE_SLOTS);
/* Egress ifindex -> dequeue pacing. Shared, not per CPU: consecutive dequeues of one queue meet
 * here whatever CPU polls them (plain updates: one NAPI context serialises a veth's frames). */
BPF_ARRAY(bp_pacing, struct bp_pacing, BP_MAX_IFINDEX);
/* ifindex * BP_NUM_PRIO + priority -> PFC ingress occupancy. Shared: enqueue and dequeue
 * run on different CPUs, in different namespaces. */
BPF_ARRAY(bp_ingress, struct bp_ingress, BP_MAX_IFINDEX * BP_NUM_PRIO);
/* ifindex * BP_NUM_PRIO + priority -> PFC counters, per CPU. */
BPF_PERCPU_ARRAY(bp_pfc, struct bp_pfc_counters, BP_MAX_IFINDEX * BP_NUM_PRIO);
/* ifindex * BP_NUM_PRIO + priority -> the watchdog's verdict on that egress queue. */
BPF_ARRAY(bp_wd, struct bp_wd, BP_MAX_IFINDEX * BP_NUM_PRIO);
/* XOFF/XON crossings and received PFC frames, for the agent that sends PAUSE and gates queues. */
BPF_RINGBUF_OUTPUT(bp_events, BP_EVENT_PAGES);
/* (switch, flow hash) -> the next hop an adaptive switch keeps the flow on. */
BPF_TABLE("lru_hash", struct bp_pin_key, struct bp_pin, bp_pins, BP_MAX_PINS);
/* ifindex -> counters, per CPU so the hot path never contends. */
BPF_PERCPU_ARRAY(bp_counters, struct bp_counters, BP_MAX_IFINDEX);

#endif /* BP_MAPS_H */
