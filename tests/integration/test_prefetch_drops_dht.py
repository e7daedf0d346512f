"""Issue 40 over real hivemind DHTs: a peer of another tokenizer that sends no text declares it in its
version-4 index entry, and a receiver drops its group without downloading a chunk; a peer that lists
the issue's many-rule group in an old (version-2) entry gets it fetched and counted under every
reason, as a fault. The peer writes with its own key through the DHT, as any peer can."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest

from protocol import codec, keys
from protocol.messages import IndexEntry, RolloutIndex

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
SWARM = "itest-prefetch"
OWN_FP, OTHER_FP = "fp-receiver", "fp-other"


def test_declared_unusable_groups_cost_no_download_and_masked_faults_count(dht_factory) -> None:
    from swarm_node.swarm.admission import Admission
    from swarm_node.swarm.exchange import RolloutExchange
    from swarm_node.swarm.synthetic import synthetic_group

    receiver_t = dht_factory(SWARM)
    peer_t = dht_factory(SWARM, initial_peers=receiver_t.visible_maddrs)
    admission = Admission()
    receiver = RolloutExchange(receiver_t, SWARM, vocab_size=49_152, max_new_tokens=512, tokenizer_fingerprint=OWN_FP,
                               cross_tokenizer=True, admission=admission)
    peer = RolloutExchange(peer_t, SWARM, vocab_size=49_152, max_new_tokens=512)
    now = receiver_t.dht_time()
    window = keys.window_of(now, 30.0)
    big = synthetic_group(np.random.default_rng(0), swarm_id=SWARM, sender=peer_t.peer_id, created_at=now,
                          group_size=16, tokens=512, tokenizer_fingerprint=OTHER_FP)  # no text: unusable there
    peer.publish_groups([big], window)
    before = receiver_t.traffic.copy()
    got, drops = receiver.fetch_groups(window, 2, max_groups=4, max_per_peer=4, timeout=15, rng=random.Random(0))
    assert got == [] and drops.as_dict() == {"tokenizer_mismatch": 1}
    fetched = receiver_t.traffic["blobs_fetched"] - before["blobs_fetched"]
    read = receiver_t.traffic["bytes_in"] - before["bytes_in"]
    size = len(codec.encode(big))
    assert fetched == 0 and read < size / 10, (fetched, read, size)  # index records only
    assert admission.reputation.faults.get(peer_t.peer_id, 0.0) == 0.0

    # The next window: an old entry (it declares nothing), a group that breaks six rules and another
    # tokenizer's. Fetched as before, counted under every reason, and a fault.
    t = now + 30.0
    g = dataclasses.replace(big, created_at=t)
    first = g.completions[0]
    lp = first.logprobs.copy()
    lp[3] = np.nan
    bad = dataclasses.replace(
        g, completions=(dataclasses.replace(first, logprobs=lp, finish_reason="weird"), *g.completions[1:]),
        sampling=dataclasses.replace(g.sampling, top_p=0.9, temperature=5.0), policy_version=-1)
    data = codec.encode(bad)
    entry = IndexEntry(chunk_digests=tuple(codec.content_digest(c) for c in codec.split_chunks(data, 512 << 10)),
                       size=len(data), prompt_index=0, policy_version=-1, created_at=t)
    index = codec.encode(RolloutIndex(protocol_version=2, sender=peer_t.peer_id, window=window + 1, entries=(entry,)))
    assert peer_t.put_blobs_and_owned(codec.split_chunks(data, 512 << 10), keys.rollout_index_key(SWARM, window + 1),
                                      index, receiver_t.dht_time() + 120)
    before = receiver_t.traffic.copy()
    got, drops = receiver.fetch_groups(window + 1, 2, max_groups=4, max_per_peer=4, timeout=15, rng=random.Random(1))
    assert got == [] and drops.as_dict() == {
        "tokenizer_mismatch": 1, "logprob_nonfinite": 1, "unsupported_top_p": 1, "unsupported_temperature": 1,
        "bad_finish_reason": 1, "bad_policy_version": 1}
    assert receiver_t.traffic["bytes_in"] - before["bytes_in"] >= len(data)  # this one was downloaded
    assert admission.reputation.faults[peer_t.peer_id] == pytest.approx(1.0)
    print({"prefetch_drop": {"blobs_fetched": fetched, "bytes_in": read, "group_bytes": size},
           "old_entry_bytes_in": receiver_t.traffic["bytes_in"] - before["bytes_in"]})
