"""Model backends for the inference service: the interface (base) and its engines."""
