"""The hard caps on what one message may hold (`Limits`), applied while decoding and while encoding
(so a node never writes what its peers refuse): the frame's sizes by the codec, every string,
bytes, count and array length by the schema. Exported as `protocol.codec.Limits`."""

from __future__ import annotations

from dataclasses import dataclass

from protocol.messages import MAX_RECEIPTS, MAX_RECEIPT_REASONS


@dataclass(frozen=True)
class Limits:
    """Hard caps applied while decoding (and encoding, so we never write what peers refuse)."""

    max_encoded_bytes: int = 8 << 20  # whole message on the wire
    max_decoded_bytes: int = 16 << 20  # msgpack body after decompression
    max_objects: int = 200_000  # msgpack objects in one body
    max_completions: int = 256
    max_tokens_per_completion: int = 32_768
    max_total_tokens: int = 1 << 20
    max_string_len: int = 512  # ids, names, revisions, fingerprints, maddrs, digests (UTF-8 bytes)
    max_text_len: int = 65_536  # prompt questions and answers
    max_bytes_len: int = 8_192  # public keys and signatures
    max_metrics: int = 256
    max_metric_key_len: int = 64
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


DEFAULT_LIMITS = Limits()
