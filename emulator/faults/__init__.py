"""Faults on a running fabric: what an event takes down, and the control plane's reaction."""
