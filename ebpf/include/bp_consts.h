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
#define BP_MAX_NEXTHOPS 64
/* Priorities per port, as 802.1p has; slot BP_NUM_PRIO of the queue map is the port's total. */
#define BP_NUM_PRIO 8
#define BP_QUEUE_SLOTS (BP_NUM_PRIO + 1)
/* Routes of all switches together (per switch: one per leaf subnet, host and p2p link; a
 * 1,000-node fabric holds about 23,000). An LPM trie takes memory only for what it holds. */
#define BP_MAX_ROUTES 65536
/* Flows an adaptive switch remembers the next hop of (LRU: the idlest are forgotten first). */
#define BP_MAX_PINS 65536
/* The sending socket's family of the frames tc ingress frees from their sender (IPv4). */
#define BP_AF_INET 2
/* Bytes of the headers tc ingress reads: Ethernet, IPv4 with every option, UDP and the BTH. */
#define BP_HEADERS_MAX (14 + 60 + 8 + 12)

/* ecmp.hash modes, as user space writes them into bp_config.hash_mode. */
#define BP_HASH_FIVE_TUPLE 0 /* src, dst, protocol, ports: what a plain switch does */
#define BP_HASH_QPN 1        /* src, dst, destination QP: Meta's E-ECMP */
#define BP_HASH_QPN_PSN 2    /* src, dst, destination QP, PSN: per-packet spraying */
#define BP_HASH_EV 3         /* src, dst, UDP source port as an entropy value */

/* bp_port.flags */
#define BP_PORT_SWITCH 1   /* a router port: forward RoCEv2 in eBPF, account its egress queue */
#define BP_PORT_PEER_TBF 2 /* the peer's shaper is TBF: it charges a frame before sending it
			    * (HTB charges after), which decides the frame a busy gap paid for */
#define BP_PORT_PFC 4      /* PFC runs on this link: a switch port sends PAUSE upstream when its
			    * ingress crosses XOFF, and any port honours the PAUSE it receives */
#define BP_PORT_PRIO_QUEUES 8 /* egress is HTB with a leaf per priority: set skb->priority */
#define BP_PORT_UP 16      /* a switch port towards a higher tier (leaf to spine, spine to border):
			    * in by one and out by another is a bounce, which Tagger re-tags */
#define BP_PORT_DOWN 32    /* a fault: its fiber is cut or its switch failed; nothing leaves by it
			    * and nothing it receives is taken in (what its queue held still drains) */
#define BP_PORT_AVOID 64   /* out of its switch's ECMP groups (withdrawn, or an unhealthy path):
			    * adaptive routing moves the flows pinned to it at once */

/* IPv4 ECN codepoints (RFC 3168). */
#define BP_ECN_MASK 3
#define BP_ECN_CE 3

/* WRED's marking probability is a fraction of this. */
#define BP_PROB_ONE 65536

/*
 * Dequeue pacing (Mininet-HiFi's fidelity check): busy gaps binned by gap / ideal gap, edges in
 * 1/BP_PACING_ONE. Bin i holds ratios in [edge i-1, edge i); bin 0 below the first edge, the last
 * bin from the last one on. Bin 4, 0.9 to 1.1, is a shaper on time.
 */
#define BP_PACING_ONE 100     /* a ratio of 1: edges to the percent in integers */
#define BP_PACING_EDGE_0 25   /* bin 0, under 0.25: frames bunched (a timer or poll catching up) */
#define BP_PACING_EDGE_1 50   /* bin 1, to 0.5: two or more frames per frame time */
#define BP_PACING_EDGE_2 75   /* bin 2, to 0.75: early, paying back a late gap with saved tokens */
#define BP_PACING_EDGE_3 90   /* bin 3, to 0.9: a little early */
#define BP_PACING_EDGE_4 110  /* bin 4, 0.9 to 1.1: on time, give or take timer slack */
#define BP_PACING_EDGE_5 125  /* bin 5, to 1.25: a little late */
#define BP_PACING_EDGE_6 150  /* bin 6, to 1.5: late */
#define BP_PACING_EDGE_7 200  /* bin 7, to 2: that gap ran the link at 1/2 to 2/3 of its rate */
#define BP_PACING_EDGE_8 400  /* bin 8, to 4: under half its rate; bin 9, from 4 on: a stall */
#define BP_PACING_BINS 10     /* one more than the edges */
/* ns per second / BP_PACING_ONE: gap * rate >= edge * len * this <=> gap / (len / rate) >= edge */
#define BP_PACING_NS_PER_ONE 10000000
/* Busy gaps are clipped to this many ns (4.3 s) so gap * rate (u32 bytes/s) fits a u64. Every
 * rate a spec allows (>= 125 KB/s) sends even a 64 KB frame in well under a quarter of it, so
 * a clipped gap still lands in the last bin. */
#define BP_PACING_GAP_MAX 0xffffffff

/* 802.1Qbb PFC (IEEE 802.1Q clause 36): a MAC control frame, one pause time per priority. */
#define BP_ETH_P_MAC_CONTROL 0x8808
#define BP_PFC_OPCODE 0x0101   /* priority-based flow control */
#define BP_PAUSE_OPCODE 0x0001 /* 802.3x global PAUSE: counted and dropped, never honoured */
/* The frame that restarts a gate just reopened: a TBF throttled at the paused rate sleeps until
 * its next packet, so something must be enqueued (IEEE 802 local experimental EtherType). */
#define BP_ETH_P_KICK 0x88b5

/* The egress HTB's classes (emulator/fabric/queues.py builds them): priority p waits in leaf
 * 1:(BP_TC_LEAF_BASE + p) behind its pause gate; MAC control frames go through 1:BP_TC_CONTROL,
 * which nothing pauses. skb->priority = TC_H_MAKE(major, minor) picks the class. */
#define BP_TC_MAJOR 1
#define BP_TC_LEAF_BASE 0x10
#define BP_TC_CONTROL 0x18

/* The ingress tag in the UDP checksum field: port ifindex in the low bits, the priority it came
 * in at (its ingress accounting's) above; never 0, as ifindexes start at 1. */
#define BP_TAG_PRIO_SHIFT 12
#define BP_TAG_IFINDEX_MASK 0xfff

/* What the kernel tells the PFC agent (bp_event.kind). */
#define BP_EV_XOFF 1  /* a port's ingress crossed XOFF at a priority: send PAUSE upstream */
#define BP_EV_XON 2   /* it fell below XON: send the resume (quanta 0) */
#define BP_EV_PFC 3   /* a port received a PFC frame: gate its egress as the quanta say */
/* The PFC watchdog's actions on a stormed queue (SONiC pfcwd's), as bp_wd.action holds them. */
#define BP_WD_DROP 1    /* drop its queued and arriving packets, and the port's ingress at that
			 * priority; ignore its PAUSEs */
#define BP_WD_FORWARD 2 /* ignore its PAUSEs */
#define BP_WD_ALERT 3   /* count only */
/* The events' ring: 64 pages hold ~10,000 events, far beyond what a poll of the agent lags. */
#define BP_EVENT_PAGES 64

#endif /* BP_CONSTS_H */
