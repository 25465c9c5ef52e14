"""Compacted catalogues that processes publish and read whole: the tools the workers serve (``tools.py``)
and the agent definitions registered (``agents.py``), over one reader (``reader.py``)."""
