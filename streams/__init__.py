"""agentstream's backbone: the event vocabulary and agent rules (``core``), settings (``config``), Kafka
plumbing (``kafka``), telemetry, the consumer runtime (``runtime``), the history store (``store``), the
catalogues (``catalog``), and the client and replay's reading on top (``client``, ``replay``).
docs/architecture.md has the map; pyproject.toml's import contract keeps the layers.

Imported as ``agentstream.streams`` only. The repository keeps this folder at its top level (linked into
the package as ``agentstream/streams``), so with the repository root on ``sys.path`` a bare
``import streams.x`` would load a second copy of every module beside ``agentstream.streams.x``, whose
classes are different objects: an error raised through one copy is not caught by ``except`` on the
other's class. That import fails here, at once, naming the right one.
"""

if __name__ != "agentstream.streams":
    raise ImportError(f"import agentstream.streams (the package), not {__name__!r}: the backbone has one "
                      f"name, and a second copy of its modules would not share their classes")
