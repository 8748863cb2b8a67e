"""backplane: a packet-level emulator of a cross-datacenter RoCEv2 fabric on real Linux networking.

Layers, each a folder, importing only those below it: cli > control > workload > telemetry >
bpf > fabric > model > nic > errors (tools/ and reference/ stand apart, on nic alone and on
nothing).
"""
from pathlib import Path

# The checkout: topologies, ebpf sources and the VM recipe are read from it.
REPO = Path(__file__).resolve().parent.parent
