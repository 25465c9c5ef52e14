"""agentstream services: planner, inference, retrieval, tools (one package each), the worker host and
the replay responder.

Imported as ``agentstream.services`` only; a bare ``import services.x`` (the repository root on
``sys.path``) fails at once, as ``agentstream.streams`` explains.
"""

if __name__ != "agentstream.services":
    raise ImportError(f"import agentstream.services (the package), not {__name__!r}: the services have one "
                      f"name, and a second copy of their modules would not share their classes")
