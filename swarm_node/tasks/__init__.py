"""Prompt sources (built-in arithmetic, GSM8K, MATH-500) and verifiable rewards."""
