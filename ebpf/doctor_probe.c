// SPDX-License-Identifier: GPL-2.0
/*
 * The smallest XDP program: `backplane doctor` compiles and loads it with bcc to prove that
 * bcc, clang and the kernel headers it was pointed at work together on this machine.
 */
#include <uapi/linux/bpf.h>

int doctor_probe(struct xdp_md *ctx)
{
	return XDP_PASS;
}
