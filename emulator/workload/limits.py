"""What a collective job may ask for: the operations, the bounds of its options and its default
chunk. Apart from the modules that run them (numpy, the fabric's netlink) so the CLI can build
its options without loading those: each start of it costs seconds in a QEMU guest without KVM."""
from __future__ import annotations

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
MAX_QPS = 64  # per link: NCCL's connections use a few; 16 is Meta's
MAX_CHANNELS = 32
MAX_ADMISSION = 64  # clear-to-send window; NCCL's buffers hold 8 steps (NCCL_STEPS)
# Emulated bytes of a chunk: about 64 full packets, so a 16 MB message pipelines in 64 chunks;
# the soft-NIC's CPU, not the real fabric's buffers, is what the chunk is sized for.
CHUNK_BYTES = 256_000
