"""The hard caps on what one message may hold (`Limits`), applied while decoding and while encoding
(so a node never writes what its peers refuse): the frame's sizes by the codec, every string,
bytes, count and array length by the schema. Exported as `protocol.codec.Limits`.

Every size here is in bytes: a string's bound is the length of its UTF-8 encoding, never its
number of characters (a string of 512 four-byte characters is 2,048 bytes and over a 512 bound).

The body a message may decompress to depends on its kind (`max_body_bytes`): the codec refuses a
header declaring more before it decompresses anything, so a small hostile record costs at most its
kind's cap of decompression, not the message limit. A status record is bounded by `max_status_bytes`
(64 KiB: the largest valid status body is 56,278 bytes, tests/unit/test_receipts_protocol.py);
index records and prompt-set manifests and tombstones by 1 MiB (an honest index lists at most 256
entries of ~100-200 bytes; a manifest at most 4,096 digests of 64 characters); rollout groups and
prompt chunks by `max_decoded_bytes`.
"""

from __future__ import annotations

from dataclasses import dataclass

from protocol.messages import MAX_RECEIPT_REASONS, MAX_RECEIPTS


@dataclass(frozen=True)
class Limits:
    """Hard caps applied while decoding (and encoding, so we never write what peers refuse)."""

    max_encoded_bytes: int = 8 << 20  # whole message on the wire
    max_decoded_bytes: int = 16 << 20  # msgpack body after decompression (any kind)
    max_status_bytes: int = 64 << 10  # body of a NodeStatus after decompression
    max_record_bytes: int = 1 << 20  # body of a RolloutIndex, PromptSetManifest or PromptSetTombstone
    max_objects: int = 200_000  # msgpack objects in one body
    max_completions: int = 256
    max_tokens_per_completion: int = 32_768
    max_total_tokens: int = 1 << 20
    max_string_len: int = 512  # ids, names, revisions, fingerprints, maddrs, digests (UTF-8 bytes)
    max_text_len: int = 65_536  # prompt questions and answers (UTF-8 bytes)
    max_bytes_len: int = 8_192  # public keys and signatures
    max_metrics: int = 256
    max_metric_key_len: int = 64  # UTF-8 bytes
    max_maddrs: int = 32
    max_index_entries: int = 1_024
    max_chunk_digests: int = 4_096
    max_prompt_items: int = 4_096
    max_receipts: int = MAX_RECEIPTS  # receipts in one status record
    max_receipt_reasons: int = MAX_RECEIPT_REASONS  # drop reasons in one receipt

    @property
    def max_array_len(self) -> int:
        return max(
            16, self.max_completions, self.max_index_entries, self.max_chunk_digests,
            self.max_prompt_items, self.max_maddrs,
        )

    def max_body_bytes(self, kind: str) -> int:
        """The largest body a message of `kind` (a `codec.MessageType` name) may decompress to."""
        per_kind = {"NODE_STATUS": self.max_status_bytes, "ROLLOUT_INDEX": self.max_record_bytes,
                    "PROMPT_SET_MANIFEST": self.max_record_bytes, "PROMPT_SET_TOMBSTONE": self.max_record_bytes}
        return min(self.max_decoded_bytes, per_kind.get(kind, self.max_decoded_bytes))


DEFAULT_LIMITS = Limits()
