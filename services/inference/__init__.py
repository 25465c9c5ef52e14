"""Inference service: consumes InferenceRequested, runs a model backend, streams tokens, publishes InferenceCompleted."""
