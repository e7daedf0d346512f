"""swarm-node: collaborative GRPO (F-TIS) across a peer-to-peer swarm of different models."""

__version__ = "0.1.0"
