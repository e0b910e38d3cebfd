"""Probe definitions as data, request builders, and the warmup/measure loop."""
