"""The switches' eBPF datapath: programs in ebpf/, loaded with bcc, driven from here.

User space decides (ports, routes, hash mode, WRED thresholds are written into maps); the kernel
programs only look things up and count.
"""
