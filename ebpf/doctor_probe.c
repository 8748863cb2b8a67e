// SPDX-License-Identifier: GPL-2.0
/*
 * The smallest tc program: `backplane doctor` compiles and loads it with bcc to prove that
 * bcc, clang and the kernel headers it was pointed at work together on this machine.
 */
#include <uapi/linux/bpf.h>
#include <uapi/linux/pkt_cls.h>

int doctor_probe(struct __sk_buff *skb)
{
	return TC_ACT_OK;
}
