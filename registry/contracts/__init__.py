"""Tensor contracts: config.pbtxt, model signatures and the checks between them (pure, no network)."""
