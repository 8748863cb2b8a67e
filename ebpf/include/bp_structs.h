/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Structures shared with user space. emulator/bpf/structs.py mirrors each one field for
 * field; tests/datapath checks that the mirror and bcc's view of these agree.
 */
#ifndef BP_STRUCTS_H
#define BP_STRUCTS_H

#include "bp_consts.h"

/* One port of the fabric, by its ifindex (unique across the fabric's namespaces). */
struct bp_port {
	__u32 node_id;    /* the node this port belongs to: seeds its hash, as switches differ */
	__u32 flags;      /* BP_PORT_* */
	__u32 peer_queue; /* ifindex of the peer port whose egress queue drains into this one, or 0 */
	__u32 buffer;     /* bytes this port's egress queue holds before tail drop */
	__u8 smac[6];     /* this port's MAC: the source of what it forwards */
	__u8 dmac[6];     /* the MAC of the next router or host behind this port */
	__u32 loss;       /* drop each packet with probability loss / 2^32: a long-haul path's loss
			   * when no netem delay line is there to apply it (0: never) */
	__u32 peer_rate;  /* bytes/s the peer_queue is shaped to, 0: do not time its dequeues. Here,
			   * not in the peer's entry: the port that sees the dequeues has this entry
			   * in hand, so pacing costs no lookup; u32 as HTB and TBF carry it */
	__u32 headroom;   /* PFC: bytes this port's ingress takes beyond XOFF while its PAUSE takes
			   * effect upstream (computed in emulator/model/pfc.py); past it PFC failed */
};

/* Fabric-wide settings. */
struct bp_config {
	__u32 hash_mode; /* BP_HASH_* */
	__u32 kmin;      /* WRED: no CE marks at or below this queue depth (bytes) */
	__u32 kmax;      /* WRED: every ECT packet marked at or above this depth (bytes) */
	__u32 pmax;      /* WRED: marking probability at kmax, in 1/BP_PROB_ONE */
	__u32 lossless;  /* PFC: bit p set when priority p is lossless (0: PFC off) */
	__u32 xoff;      /* PFC: a port's ingress bytes at one priority that send PAUSE upstream */
	__u32 xon;       /* PFC: below this it sends the resume */
	__u32 tagger_dscp; /* Tagger: DSCP a bouncing lossless packet is rewritten to (0: off) */
	__u32 tagger_prio; /* ... and the lossless priority that DSCP maps to */
	__u32 adaptive;    /* ecmp.adaptive on: flows keep their next hop while they keep sending */
	__u32 flowlet_gap_ns; /* ... unless idle this long (a flowlet), which then picks anew */
};

/*
 * Key of the route table, longest prefix match over (switch, destination): the switch's node
 * id always matches whole, so prefixlen is 32 + the destination's prefix length.
 */
struct bp_route_key {
	__u32 prefixlen;
	__u32 node_id;
	__u32 addr; /* network byte order */
};

/* The next hops towards a prefix, as egress ifindexes; a port may fill several slots (its weight,
 * which adaptive routing sets), and the hash picks a slot. */
struct bp_route {
	__u32 count;
	__u32 ifindex[BP_MAX_NEXTHOPS];
};

/* Adaptive routing: a flow (its hash, on one switch) and the next hop it keeps. */
struct bp_pin_key {
	__u32 node_id;
	__u32 hash;
};

struct bp_pin {
	__u32 ifindex;
	__u32 pad;
	__u64 last_ns; /* its last packet */
};

/*
 * One egress queue, per (port, priority) and per port in total: bytes the egress hook let
 * into the qdisc minus bytes the peer's ingress saw leave it is the queue's true depth.
 */
struct bp_queue {
	__u64 enq_bytes;
	__u64 deq_bytes;
	__u64 enq_pkts;
	__u64 deq_pkts;
	__u64 max_depth; /* bytes, including the packet that found it */
};

/*
 * Dequeue pacing of one egress queue (Mininet-HiFi's fidelity check), as its peer sees frames
 * leave. A busy gap follows a dequeue that left bytes behind it: the shaper owed the next frame
 * at once, so the gap should be the charged frame's time at the port's rate. User space reads
 * two snapshots and takes differences; busy_bytes / busy_ns is the rate achieved while busy.
 */
struct bp_pacing {
	__u64 last_ns;              /* bpf_ktime_get_ns() of the last dequeue */
	__u32 last_len;             /* bytes of that frame: what HTB charged the gap after it */
	__u32 backlogged;           /* 1: that frame left bytes waiting, the next gap is busy */
	__u64 busy_ns;              /* sum of busy gaps (each clipped to BP_PACING_GAP_MAX) */
	__u64 busy_bytes;           /* sum of the bytes the shaper charged to those gaps */
	__u64 bins[BP_PACING_BINS]; /* busy gaps by gap / (charged bytes / rate), BP_PACING_EDGE_* */
};

/* Per-port, per-CPU counters: one named slot per event. */
struct bp_counters {
	__u64 rx_pkts;          /* frames received on this port */
	__u64 rx_bytes;
	__u64 roce_pkts;        /* RoCEv2 frames received and forwarded in eBPF */
	__u64 kernel_pkts;      /* frames left to the kernel's path (ARP, ICMP, TCP, ...) */
	__u64 no_route;         /* RoCEv2 with no route entry: left to the kernel */
	__u64 ttl_expired;      /* RoCEv2 with TTL <= 1: left to the kernel, which answers ICMP */
	__u64 fragments;        /* IPv4 fragments: left to the kernel */
	__u64 drop_truncated;   /* Ethernet or IPv4 header cut short */
	__u64 drop_ip_version;  /* EtherType IPv4 but version != 4 */
	__u64 drop_ip_header;   /* IHL < 5 or total length shorter than the header */
	__u64 drop_roce_header; /* UDP 4791 without a whole UDP header and BTH */
	__u64 fwd_pkts;         /* forwarded out of this port by eBPF */
	__u64 fwd_bytes;
	__u64 tx_pkts;          /* let into this port's egress queue */
	__u64 tx_bytes;
	__u64 ecn_marks;        /* ECT packets marked CE here */
	__u64 drop_buffer;      /* tail drops: the egress buffer was full */
	__u64 drop_no_port;     /* a route named a port that is not in the port table */
	__u64 drop_loss;        /* dropped as the long-haul path's configured loss */
	__u64 mac_control;      /* 802.3x PAUSE or other MAC control frames: counted, dropped */
	__u64 kicks;            /* gate restarts received (BP_ETH_P_KICK): dropped */
	__u64 tagged;           /* lossless packets that bounced here and moved to Tagger's priority */
	__u64 drop_link_down;   /* sent or received while the port was down (a cut, a failed switch) */
	__u64 ar_moved;         /* adaptive: packets whose flow left the next hop it was pinned to */
	__u64 drop_nomem;       /* a sender's frame with no memory for the clone that frees its socket */
};

/*
 * A switch port's ingress occupancy at one priority (802.1Qbb's per-priority ingress
 * accounting): bytes that came in on it and have not yet left the switch. Enqueue (tc egress)
 * adds; the peer of the egress port they left by (tc ingress) takes away, told the ingress port by a
 * tag the egress hook writes into the UDP checksum (RoCEv2 sends 0 there, the ICRC masks it).
 */
struct bp_ingress {
	__u64 bytes;     /* signed in effect: a dequeue may be counted before its enqueue */
	__u64 max_bytes; /* the highest occupancy seen */
	__u32 paused;    /* 1 between the XOFF and the XON this port asked upstream for */
	__u32 pad;
};

/* PFC per (port, priority), per CPU, as `dcb pfc` shows requests and indications. */
struct bp_pfc_counters {
	__u64 tx_pause;      /* PFC frames sent with this priority enabled and a pause time */
	__u64 tx_resume;     /* ... enabled with pause time 0 */
	__u64 rx_pause;      /* PFC frames received with this priority enabled and a pause time */
	__u64 rx_resume;
	__u64 drop_headroom; /* lossless packets the ingress had no headroom left for: PFC failed */
	__u64 wd_tx_ok;      /* watchdog, while stormed: packets that left the queue */
	__u64 wd_tx_drop;    /* ... queued or arriving packets it dropped */
	__u64 wd_rx_ok;      /* ... packets received on the port at this priority */
	__u64 wd_rx_drop;    /* ... of those, dropped */
	__u64 pause_ignored; /* PFC frames for this priority not obeyed (drop/forward) */
};

/* The PFC watchdog's state of one egress queue (port, priority). The agent detects storms and
 * restores; the kernel acts on what is written here. */
struct bp_wd {
	__u32 stormed;       /* 1 from detection to restoration */
	__u32 action;        /* BP_WD_*, while stormed */
	__u64 last_pause_ns; /* bpf_ktime_get_ns() of the last PFC frame that paused it */
};

/* One event for the PFC agent in user space, through the bp_events ring. */
struct bp_event {
	__u64 ns;        /* bpf_ktime_get_ns() */
	__u32 kind;      /* BP_EV_* */
	__u32 ifindex;   /* XOFF/XON: the ingress port to send out of; PFC: the port it came in by */
	__u32 prio;      /* XOFF/XON: the priority */
	__u32 vector;    /* PFC: the class-enable vector */
	__u16 quanta[BP_NUM_PRIO]; /* PFC: pause time per priority, in 512 bit times */
};

#endif /* BP_STRUCTS_H */
