"""The swarm-node wire protocol: messages, codec, DHT keys and validation.

Pure: depends on the standard library, msgpack, numpy and zstandard only (never torch or hivemind),
so it can be audited and fuzzed on its own.
"""

from protocol.codec import DEFAULT_LIMITS, DEFAULT_SCHEME, Limits, Scheme, decode, encode
from protocol.messages import (
    EXCHANGE_VERSION,
    INDEX_VERSION,
    PROTOCOL_VERSION,
    STATUS_VERSION,
    SUPPORTED_VERSIONS,
    Completion,
    IndexEntry,
    Message,
    NodeStatus,
    PromptChunk,
    PromptRef,
    PromptSetManifest,
    PromptSetTombstone,
    ProtocolError,
    Receipt,
    RolloutGroup,
    RolloutIndex,
    SamplingParams,
)

__all__ = [
    "DEFAULT_LIMITS",
    "DEFAULT_SCHEME",
    "EXCHANGE_VERSION",
    "INDEX_VERSION",
    "PROTOCOL_VERSION",
    "STATUS_VERSION",
    "SUPPORTED_VERSIONS",
    "Completion",
    "IndexEntry",
    "Limits",
    "Message",
    "NodeStatus",
    "PromptChunk",
    "PromptRef",
    "PromptSetManifest",
    "PromptSetTombstone",
    "ProtocolError",
    "Receipt",
    "RolloutGroup",
    "RolloutIndex",
    "SamplingParams",
    "Scheme",
    "decode",
    "encode",
]
