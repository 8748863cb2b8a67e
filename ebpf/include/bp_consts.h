/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Constants shared by the switch programs and mirrored in emulator/bpf/structs.py
 * (a test compares the two).
 */
#ifndef BP_CONSTS_H
#define BP_CONSTS_H

/* RoCEv2 rides on this UDP destination port (IBTA Annex A17). */
#define BP_ROCE_PORT 4791
/* Ports carry globally unique ifindexes below this (the plan numbers them from 100). */
#define BP_MAX_IFINDEX 4096
/* Most equal-cost next hops a route can have: 8 long-haul paths, with room to spare. */
#define BP_MAX_NEXTHOPS 16
/* Priorities per port, as 802.1p has; slot BP_NUM_PRIO of the queue map is the port's total. */
#define BP_NUM_PRIO 8
#define BP_QUEUE_SLOTS (BP_NUM_PRIO + 1)
/* Routes of all switches together (per switch: one per leaf subnet, host and p2p link). */
#define BP_MAX_ROUTES 16384
/* Tags the metadata XDP leaves for tc, so tc never trusts bytes another program left there. */
#define BP_META_MAGIC 0x42504d31 /* "BPM1" */

/* ecmp.hash modes, as user space writes them into bp_config.hash_mode. */
#define BP_HASH_FIVE_TUPLE 0 /* src, dst, protocol, ports: what a plain switch does */
#define BP_HASH_QPN 1        /* src, dst, destination QP: Meta's E-ECMP */
#define BP_HASH_QPN_PSN 2    /* src, dst, destination QP, PSN: per-packet spraying */
#define BP_HASH_EV 3         /* src, dst, UDP source port as an entropy value */

/* bp_port.flags */
#define BP_PORT_SWITCH 1 /* a router port: forward RoCEv2 in eBPF, account its egress queue */

/* IPv4 ECN codepoints (RFC 3168). */
#define BP_ECN_MASK 3
#define BP_ECN_CE 3

/* WRED's marking probability is a fraction of this. */
#define BP_PROB_ONE 65536

#endif /* BP_CONSTS_H */
