"""What a receiver checks of a peer's index entry before fetching its group, and of the group after:
every reason a record has, consistency before age (`verdicts.py`: what each reason says of the sender).

Before the fetch (`entry_reasons`; nothing downloaded yet): well-formed chunk digests
(`index_mismatch`), a size and chunk count within what one fetch may download (`oversized`: over
`max_group_bytes`, or chunks that could hold more than the per-sender byte budget; `index_mismatch`:
more chunks than its size allows), not a group taken already (`duplicate`), listed in the index of
the window its time lies in (`index_mismatch`), then its age (`stale`, `from_future`: only a record
consistent so far gets one), then what a version-4 entry declares: a G within this node's bounds
(`group_too_small`, `group_too_large`), a tokenizer this node can use (`tokenizer_mismatch`:
another one, and no text or this node's cross-tokenizer exchange off), then the admission's rules
(`group_size_changed`, `wrong_prompt`, `window_slot_overused`).

After the fetch (`group_reasons`): the declared size, a group that decodes and is its sender's,
every reason of `protocol.validate.validate_group`, agreement with its entry (prompt, policy
version, time; the tokenizer, text and G it declares: else `index_mismatch`), then its age, a
duplicate of a group taken, the node's own filter and the admission's rules.

Checks with side effects (a place of the sender's window quota, the gather's token budget) run
only for a record with no other reason; for a record with honest reasons only, the prompt binding is
still checked (without taking a place), so an honest reason cannot hide a wrong prompt.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

from protocol import codec, keys
from protocol.messages import IndexEntry, ProtocolError, RolloutGroup
from protocol.validate import GROUP_TOO_LARGE, GROUP_TOO_SMALL, TOKENIZER_MISMATCH, ValidationLimits, validate_group
from swarm_node.swarm.admission import Admission
from swarm_node.swarm.statuses import SENDER_MISMATCH, WRONG_TYPE, decode_reason
from swarm_node.swarm.transport import MAX_BLOB_BYTES, is_digest
from swarm_node.swarm.verdicts import is_fault

MIN_CHUNK_BYTES = 64 << 10  # an index may not list more than size / MIN_CHUNK_BYTES + 1 chunks

INDEX_MISMATCH = "index_mismatch"
OVERSIZED = "oversized"
STALE = "stale"
FUTURE = "from_future"
BAD_TIMESTAMP = "bad_timestamp"
DUPLICATE = "duplicate"


def fetch_cost(entry: IndexEntry) -> int:
    """The most fetching `entry` can download: a chunk's real size is known only once it is here, and
    any chunk may hold up to MAX_BLOB_BYTES (what a sender's byte budget per gather is charged)."""
    return len(entry.chunk_digests) * MAX_BLOB_BYTES


@dataclass
class RecordChecks:
    """The checks of one node (module doc). `seen_groups`: (sender, prompt, policy version) of the
    groups taken; `max_fetch_bytes`: the per-sender byte budget of a gather (`fetch_cost`)."""

    limits: ValidationLimits
    window_seconds: float
    max_group_bytes: int
    max_fetch_bytes: int
    codec_limits: codec.Limits
    seen_groups: Collection[tuple[str, int, int]]
    admission: Admission | None = None
    group_filter: Callable[[RolloutGroup], str | None] | None = None

    # ---- before the fetch -------------------------------------------------------------------

    def entry_reasons(self, owner: str, entry: IndexEntry, window: int, current: int, staleness: int) -> list[str]:
        """Every reason not to fetch `entry` of `owner`'s index of `window` (empty: a candidate)."""
        reasons: list[str] = []
        if not entry.chunk_digests or any(not is_digest(d) for d in entry.chunk_digests):
            reasons.append(INDEX_MISMATCH)
        elif len(entry.chunk_digests) > entry.size // MIN_CHUNK_BYTES + 1:
            reasons.append(INDEX_MISMATCH)
        if entry.size > self.max_group_bytes or fetch_cost(entry) > self.max_fetch_bytes:
            reasons.append(OVERSIZED)
        if (owner, entry.prompt_index, entry.policy_version) in self.seen_groups:
            reasons.append(DUPLICATE)
        in_window = self._window_reason(entry.created_at, window)
        reasons += [in_window] if in_window else self._age(entry.created_at, current, staleness)
        if entry.declared:
            reasons += self._declared_reasons(entry)
        return self._with_admission(reasons, owner, entry)

    def _window_reason(self, created_at: float, window: int) -> str | None:
        """A group is listed in the index of its own window (binding.py): else its time lies."""
        try:
            return None if keys.window_of(created_at, self.window_seconds) == window else INDEX_MISMATCH
        except ProtocolError:
            return BAD_TIMESTAMP

    def _declared_reasons(self, entry: IndexEntry) -> list[str]:
        reasons = []
        if entry.group_size and entry.group_size < self.limits.min_group_size:
            reasons.append(GROUP_TOO_SMALL)
        if entry.group_size > self.limits.max_group_size:
            reasons.append(GROUP_TOO_LARGE)
        own = self.limits.expected_tokenizer_fingerprint
        if own is not None and entry.tokenizer_fingerprint != own and not (self.limits.cross_tokenizer and entry.has_text):
            reasons.append(TOKENIZER_MISMATCH)
        return reasons

    def _with_admission(self, reasons: list[str], owner: str, entry: IndexEntry) -> list[str]:
        if self.admission is None or any(is_fault(r) for r in reasons):
            return reasons
        refused = self.admission.entry_reason(owner, entry.prompt_index, entry.created_at, entry.group_size,
                                              hold=not reasons)
        return reasons + [refused] if refused is not None else reasons

    def age_reason(self, created_at: float, current: int, staleness: int) -> str | None:
        """`stale` before the windows read, `from_future` beyond the next one (a consistent record)."""
        reasons = self._age(created_at, current, staleness)
        return reasons[0] if reasons else None

    def _age(self, created_at: float, current: int, staleness: int) -> list[str]:
        try:
            w = keys.window_of(created_at, self.window_seconds)
        except ProtocolError:
            return [BAD_TIMESTAMP]
        if w < current - staleness:
            return [STALE]
        return [FUTURE] if w > current + 1 else []

    # ---- after the fetch ------------------------------------------------------------------

    def group_reasons(self, entry: IndexEntry, owner: str, window: int, data: bytes, current: int,
                      staleness: int) -> tuple[list[str], RolloutGroup | None]:
        """([], group) when it is taken, else (every reason, the group when it decoded and is its sender's)."""
        if len(data) != entry.size:
            return [INDEX_MISMATCH], None
        try:
            group = codec.decode(data, self.codec_limits)
        except ProtocolError:
            return [decode_reason(data)], None
        if not isinstance(group, RolloutGroup):
            return [WRONG_TYPE], None
        if group.sender != owner:
            return [SENDER_MISMATCH], None
        reasons = validate_group(group, self.limits)
        consistent = self._agrees(group, entry)
        if not consistent:
            reasons.append(INDEX_MISMATCH)
        else:
            reasons += self._age(group.created_at, current, staleness)
        if (group.sender, group.prompt.index, group.policy_version) in self.seen_groups:
            reasons.append(DUPLICATE)
        if not reasons and self.group_filter is not None:
            extra = self.group_filter(group)
            reasons += [extra] if extra is not None else []
        if not reasons and self.admission is not None:
            refused = self.admission.group_reason(group, window)
            reasons += [refused] if refused is not None else []
        return reasons, group

    @staticmethod
    def _agrees(group: RolloutGroup, entry: IndexEntry) -> bool:
        """Whether `group` is what its index entry says it is (what a version-4 entry declares too)."""
        claimed = (entry.prompt_index, entry.policy_version, entry.created_at)
        if (group.prompt.index, group.policy_version, group.created_at) != claimed:
            return False
        if not entry.declared:
            return True
        has_text = bool(group.completions) and all(c.has_text for c in group.completions)
        return (group.tokenizer_fingerprint == entry.tokenizer_fingerprint and has_text == entry.has_text
                and len(group.completions) == entry.group_size)
