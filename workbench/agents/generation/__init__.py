"""Sampling: the prefill, the decode loops, KV caches and the rollout-engine interface."""
