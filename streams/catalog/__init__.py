"""Compacted catalogues that processes publish and read on start: the tools the workers serve."""
