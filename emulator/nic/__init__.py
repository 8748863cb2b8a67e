"""The hosts' RoCEv2 soft-NIC: wire format (wire.py) first; transport and verbs follow."""
