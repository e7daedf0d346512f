"""Held-out evaluation through the node's generator, and its statistics."""
