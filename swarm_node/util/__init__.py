"""Leaves anything may import: atomic writes, reading the JSONL logs a node appends to, typed errors, the supervised lifecycle, machine info."""
