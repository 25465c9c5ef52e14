"""Faults and attacks under load: the chaos suite (``chaos`` and its ``chaos_*`` parts), a broker failing on a
three-node cluster, a flooded schemas topic — each checks that every run still finishes exactly once."""
