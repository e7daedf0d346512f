"""A running node's switch to the successor of its ended prompt set, between two steps.

An operator ends a seeded set with a tombstone that names its successor (`swarm-node end-prompt-set
--successor`); a node whose operator key is configured (`swarm.prompt_set_owner`) follows it
(swarm/prompts.py, `load_followed`). A node that starts on an ended set loads the successor at once
(`assemble.build_parts`). A running node's keeper (swarm/prompt_keeper.py) sees the end, loads the
successor in its own thread and hands it to `switch_prompt_set` from the step loop, between two
steps; what depends on the prompt set changes there:

* `NodeParts.prompt_set`: the next step's prompts are the successor's;
* the admission's prompt binding (swarm/binding.py): peers' groups are checked against the
  successor's assignment. For one `swarm.record_ttl_s` after the switch (more than any following
  node takes to see the end: its keeper reads the key every window) an index entry that only the
  ended set's assignment takes is still fetched (`HandoverQuota`), since an index entry names no
  set, and a peer's group on the ended set is trained on (`NodeParts.ended_prompt_set`, read by
  `peer_rollouts._known_problem`): its problems are as good as they were, and dropping them left
  nodes without peer groups for about 25 steps at each switch in the soak. Not when the successor
  has another answer kind (the ended set's reward is gone) nor in horizontal collaboration (its
  advantage groups are keyed by prompt index alone); there, and after the handover, such a group
  is dropped as `unknown_prompt`, counted and no fault of the peer, rather than blamed as
  `wrong_prompt`. A group naming the successor is checked against the successor's assignment
  alone. The other way round
  is not covered: a node that has not seen the end yet judges a switched peer's entries by the
  ended set (`wrong_prompt`, a fault), for at most about one window;
* the reward function, when the successor's answer kind differs;
* the prompt-length check, as at start: a successor whose prompts this node cannot take stops it
  with the error a restart would give.

The held-out evaluator keeps the problems it drew at start (disjoint from the first set only).
"""

from __future__ import annotations

import logging

from protocol.messages import RolloutGroup
from swarm_node.node.parts import NodeParts
from swarm_node.node.peer_rollouts import TOKENIZER_LOCK
from swarm_node.swarm.binding import WRONG_PROMPT, PromptAssignment, WindowQuota
from swarm_node.swarm.prompts import FollowedSet

log = logging.getLogger(__name__)


class HandoverQuota:
    """The binding's quota across a switch: `current`'s; at the index level, for entries created
    (DHT time) before `until`, also `previous`'s. Stands in for a `WindowQuota` in `Admission.binding`."""

    def __init__(self, current: WindowQuota, previous: WindowQuota | None, until: float) -> None:
        self.current, self.previous, self.until = current, previous, until

    @property
    def assignment(self) -> PromptAssignment:
        return self.current.assignment

    def begin_gather(self) -> None:
        self.current.begin_gather()
        if self.previous is not None:
            self.previous.begin_gather()

    def entry_reason(self, owner: str, index: int, created_at: float) -> str | None:
        reason = self.current.entry_reason(owner, index, created_at)
        if (reason == WRONG_PROMPT and self.previous is not None and created_at < self.until
                and self.previous.entry_reason(owner, index, created_at) is None):
            return None  # assigned on the ended set: a peer not switched yet (its group names that set)
        return reason

    def group_reason(self, group: RolloutGroup) -> str | None:
        return self.current.group_reason(group)

    def take(self, group: RolloutGroup) -> None:
        self.current.take(group)

    def forget_before(self, oldest_window: int) -> None:
        self.current.forget_before(oldest_window)
        if self.previous is not None:
            self.previous.forget_before(oldest_window)


def switch_prompt_set(parts: NodeParts, followed: FollowedSet, assignment: PromptAssignment) -> None:
    """Move `parts` onto `followed.prompt_set` (see the module doc); `assignment`: the binding over it
    (`assemble.prompt_assignment`). Checks first, so a refused successor changes nothing."""
    from swarm_node.tasks import make_reward_fn
    from swarm_node.tasks.prompt_lengths import check_prompt_lengths

    cfg, old, new = parts.config, parts.prompt_set, followed.prompt_set
    with TOKENIZER_LOCK:
        check_prompt_lengths(parts.policy.tokenizer, new.problems, new.id, cfg.generation.max_prompt_tokens,
                             cfg.task.system_prompt, cfg.task.worked_example)
    if new.answer_kind != old.answer_kind:
        reward_fn, previous = make_reward_fn(cfg.task, new.answer_kind), parts.reward_fn
        parts.close_hooks.append(reward_fn.close)
        parts.reward_fn = reward_fn
        close = getattr(previous, "close", None)
        if close is not None:
            if close in parts.close_hooks:
                parts.close_hooks.remove(close)
            close()
    until = parts.dht_time() + cfg.swarm.record_ttl_s
    admission = parts.admission
    if admission is not None:
        binding = admission.binding
        previous_quota = binding.current if isinstance(binding, HandoverQuota) else binding
        admission.prompts = assignment
        admission.binding = HandoverQuota(WindowQuota(assignment), previous_quota, until=until)  # type: ignore[assignment]
    # Not to another answer kind (the ended set's reward is gone) nor in horizontal collaboration (its
    # advantage groups are keyed by prompt index alone, which the two sets share).
    handover = new.answer_kind == old.answer_kind and cfg.swarm.collaboration != "horizontal"
    parts.ended_prompt_set = (old, until) if handover else None
    parts.prompt_set = new
    log.info("switched to prompt set %s (%d problems), the successor of %s, which its operator ended",
             new.id, len(new), " -> ".join(followed.ended) or old.id)
