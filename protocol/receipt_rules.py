"""What a receipt may claim: rules that tie its counts to each other and to its span, and the drop
reasons it may name. Readers apply them to every status record they read (`claim_reasons`: a
record that breaks one is dropped and counted as `status_<reason>`), on top of `validate`'s bounds.

Identities are free: whoever runs a node can state anything in its own record. These rules do not
make a receipt true; they make it say no more than a node could have done in the time it names:

* only a trainer judges groups, so only a `trainer` record carries receipts (`receipts_not_trainer`);
* a receipt's groups (taken plus dropped) are at most `RECEIPT_BURST_GROUPS` plus
  `MAX_RECEIPT_GROUPS_PER_S` per second of the record's span (`receipt_over_rate`): a node reads
  at most a few index records of one sender per gather, each listing at most 256 entries;
* its samples are at most its groups taken times `MAX_GROUP_SIZE`, the largest G the protocol
  carries (`receipt_samples_over_groups`); samples with gradient plus filtered samples are at most
  the samples, filtered by a condition at most the filtered (validate's `bad_receipt_count`);
* a drop reason it names is one of `DROP_REASONS`, the reasons this project's nodes drop a group or
  index record for; any other name is counted under `other` when read (`known_reason`), so a
  receiver cannot publish words of its own about a sender.

A reason added to the node's checks is added here in the same change (tests/unit/test_receipt_rules.py
collects the reason constants of the modules that drop peer data and checks each is listed).
"""

from __future__ import annotations

from protocol.messages import OTHER_REASON, NodeStatus, Receipt

RECEIPTS_NOT_TRAINER = "receipts_not_trainer"
RECEIPT_OVER_RATE = "receipt_over_rate"
RECEIPT_SAMPLES_OVER_GROUPS = "receipt_samples_over_groups"
CLAIM_REASONS = (RECEIPTS_NOT_TRAINER, RECEIPT_OVER_RATE, RECEIPT_SAMPLES_OVER_GROUPS)

MAX_GROUP_SIZE = 256  # completions in one group at most (codec Limits.max_completions, generation.group_size)
MAX_RECEIPT_GROUPS_PER_S = 64.0  # groups and index records of one sender judged per second, at most
RECEIPT_BURST_GROUPS = 1024  # ... plus this many at once (four full index records of one sender)

DROP_REASONS: frozenset[str] = frozenset({
    OTHER_REASON,
    # a group that breaks the wire rules (validate.GROUP_REASONS)
    "bad_version", "empty_group", "group_too_small", "group_too_large", "empty_completion", "too_many_tokens",
    "token_out_of_vocab", "length_mismatch", "logprob_nonfinite", "logprob_positive", "logprob_below_floor",
    "unsupported_top_p", "unsupported_temperature", "bad_finish_reason", "bad_sampling", "bad_prompt_ref",
    "bad_adapter_digest", "bad_timestamp", "bad_policy_version", "wrong_swarm", "tokenizer_mismatch",
    "text_invalid_utf8", "text_pieces_mismatch", "text_too_long", "text_forbidden_char", "text_partial",
    # records and chunks (swarm/exchange.py, swarm/statuses.py, swarm/transport.py)
    "decode_error", "wrong_type", "sender_mismatch", "index_mismatch", "oversized", "stale", "from_future",
    "duplicate", "fetch_timeout", "hash_mismatch", "missing", "bad_digest", "wrong_shard",
    # admission and the prompt binding (swarm/admission.py, swarm/binding.py)
    "not_allowed", "excluded_peer", "group_size_changed", "over_token_budget", "wrong_prompt",
    "window_slot_overused",
    # the node's own checks (node/peer_rollouts.py, peers/, tasks/verify.py)
    "unknown_prompt", "over_peer_cap", "own_group", "rejected_before", "nonfinite_step", "no_text",
    "piece_bytes", "text_roundtrip", "text_token_mismatch", "logprob_mismatch", "verifier_timeout", "verify_budget",
})


def known_reason(reason: str) -> str:
    """`reason` when it is one of DROP_REASONS, else `other`."""
    return reason if reason in DROP_REASONS else OTHER_REASON


def max_groups(span_s: float) -> int:
    """The most groups (and index records) of one sender a receipt over `span_s` seconds may count."""
    return RECEIPT_BURST_GROUPS + int(MAX_RECEIPT_GROUPS_PER_S * max(0.0, span_s))


def receipt_claim_reasons(receipt: Receipt, span_s: float) -> list[str]:
    """Which of the count rules one receipt (of a record of span `span_s`) breaks."""
    reasons = []
    if receipt.taken + sum(n for _, n in receipt.dropped) > max_groups(span_s):
        reasons.append(RECEIPT_OVER_RATE)
    if receipt.samples > receipt.taken * MAX_GROUP_SIZE:
        reasons.append(RECEIPT_SAMPLES_OVER_GROUPS)
    return reasons


def claim_reasons(status: NodeStatus) -> list[str]:
    """Reasons to drop a status record whose receipts claim more than a node could have done
    (empty: keep it). Call on a record `validate.validate_status` accepted (counts are ints)."""
    if not status.receipts:
        return []
    reasons = [] if status.role == "trainer" else [RECEIPTS_NOT_TRAINER]
    for receipt in status.receipts:
        reasons += [r for r in receipt_claim_reasons(receipt, status.receipts_span_s) if r not in reasons]
    return reasons


def fit_claims(receipt: Receipt, span_s: float) -> Receipt:
    """`receipt` cut down to what the rules allow over `span_s` (what a node writes: a sender that
    makes a receiver count more drops than the rate allows, by listing one payload many times say,
    must not get the receiver's record dropped by its readers): groups taken first, then drops,
    commonest reasons first; samples down to groups taken x MAX_GROUP_SIZE, the sample counts scaled
    with them."""
    budget = max_groups(span_s)
    taken = min(receipt.taken, budget)
    dropped, left = [], budget - taken
    for reason, n in receipt.dropped:
        if min(n, left) > 0:
            dropped.append((reason, min(n, left)))
            left -= min(n, left)
    samples, gradient, filtered = receipt.samples, receipt.gradient, receipt.filtered
    by_advantage, by_kl = receipt.filtered_advantage, receipt.filtered_kl
    cap = taken * MAX_GROUP_SIZE
    if samples > cap:
        def scaled(n: int) -> int:
            return n * cap // samples

        gradient, filtered, by_advantage, by_kl = scaled(gradient), scaled(filtered), scaled(by_advantage), scaled(by_kl)
        samples = cap
    return Receipt(sender=receipt.sender, taken=taken, samples=samples, gradient=gradient, filtered=filtered,
                   filtered_advantage=min(by_advantage, filtered), filtered_kl=min(by_kl, filtered),
                   dropped=tuple(dropped))
