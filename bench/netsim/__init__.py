"""Simulated networks: test hosts from network namespaces joined by a user-space link emulator
(``testnet``), and what distance between the parts costs a run (``regions``). Needs root."""
