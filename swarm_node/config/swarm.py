"""`swarm`: how a node meets peers (the DHT, NAT), what it takes from them (caps, staleness, the prompt
binding, closed swarms) and what it stores for them; a section of `NodeConfig` (config.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from swarm_node.config.spotcheck import SpotCheckConfig


class SwarmConfig(BaseModel):
    """How the node meets peers and exchanges rollouts."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    enabled: bool = Field(True, description="False: train alone without a DHT (the isolated baseline).")
    swarm_id: str = Field("swarm-node-default", min_length=1, max_length=64, description="Swarm name; keys are namespaced by it.")
    initial_peers: list[str] = Field(default_factory=list, description="Multiaddrs of peers to bootstrap from.")
    host_maddrs: list[str] = Field(
        default_factory=lambda: ["/ip4/0.0.0.0/tcp/0"], description="Addresses the DHT listens on."
    )
    announce_maddrs: list[str] = Field(default_factory=list, description="Public addresses announced to peers.")
    client_mode: bool = Field(False, description="Do not accept incoming connections (behind NAT).")
    use_relay: bool = Field(True, description="Allow relayed connections (libp2p circuit relay).")
    use_auto_relay: bool = Field(False, description="Look for relays automatically when behind NAT.")
    collaboration: Literal["vertical", "horizontal"] = Field("vertical", description="Who generates a group.")
    max_peer_fraction: float = Field(0.5, ge=0, le=1, description="Cap on the share of peer groups in a step.")
    max_peer_groups_per_step: int = Field(8, ge=0, description="Peer groups fetched per step, at most.")
    max_groups_per_peer: int = Field(4, ge=0, description="Groups taken from one peer per step, at most.")
    fetch_timeout_s: float = Field(10.0, gt=0, description="Longest wait for peers' data in one step.")
    staleness_steps: int = Field(
        4, ge=0,
        description="Peer groups older than this many windows are dropped. So a group must be published within "
                    "about staleness_steps x window_seconds (120 s by default) of its step's start: a node whose "
                    "step takes longer generates it in sub-batches, publishes each as soon as it is complete, and "
                    "trains on, but does not publish, groups complete too late (docs/architecture.md, \"Slow "
                    "nodes\"). The swarm should agree on it. The default is measured (docs/results/staleness.md): "
                    "F-TIS's gain on a peer's group is largest up to 2 of the receiver's steps of age and about half "
                    "that from 4 to 16 steps, never below training alone, so older groups are admitted but a "
                    "gather takes each peer's newest first.")
    window_seconds: float = Field(
        30.0, gt=0,
        description="Length of a DHT time window for index keys (and of the prompt binding's windows); with "
                    "staleness_steps it bounds how long after its step's start a group can be published. The "
                    "swarm should agree on it. With newest-first gathering, a node stepping about once a window "
                    "takes peers' groups 0-1 of its steps old, where F-TIS's measured gain is largest "
                    "(docs/results/staleness.md).")
    record_ttl_s: float = Field(300.0, gt=0, description="Expiration of published records.")
    index_peers_per_shard: int = Field(
        16, ge=1, le=4096,
        description=(
            "Sharded rollout index: a window's index gets more shards as the swarm grows, so that one shard "
            "holds at most about this many peers' records (and at least a quarter of it). Use the same value "
            "on every node of a swarm."
        ),
    )
    index_shards_per_read: int = Field(
        1, ge=1, le=64,
        description=(
            "Index shards read per window per step (plus one probe of a neighbouring shard level in the "
            "two newest windows): bounds a node's index reads whatever the swarm size."
        ),
    )
    startup_timeout_s: float = Field(60.0, gt=0, description="Longest wait for the DHT process to start.")
    start_attempts: int = Field(
        2, ge=1, le=10, description="DHT start attempts (each up to startup_timeout_s) before giving up with an error."
    )
    prompt_set_id: str | None = Field(None, description="Load the prompt set seeded under this id.")
    prompt_set_owner: str | None = Field(None, description="Operator public key that must sign the prompt set.")
    prompt_set_restore_budget_bytes: int = Field(
        32 << 20, ge=0, le=1 << 30,
        description="Bytes of the seeded prompt set (prompt_set_id) this node holds and re-stores before its records "
                    "lapse, about once per record_ttl_s, so the set outlives its seeder (swarm/prompt_keeper.py). "
                    "A larger set is kept in part; 0: never re-store.")
    min_peer_group_size: int | None = Field(
        None, ge=1, le=256, description="Smallest peer group taken (None: generation.group_size, the local G).")
    max_peer_group_size: int | None = Field(
        None, ge=1, le=256, description="Largest peer group taken (None: generation.group_size, the local G).")
    peer_prompts_per_step: int | None = Field(
        None, ge=1, le=4096,
        description="n of the prompt binding (swarm/binding.py): the prompts a step answers. A peer group's prompt "
                    "must be among the first n x slots_per_window that `select_prompts` assigns to its sender and the "
                    "window of its creation time (None: train.prompts_per_step; the swarm should agree on it).")
    slots_per_window: int = Field(
        16, ge=1, le=1024,
        description="Published steps per sender and window (the prompt binding's S, swarm/binding.py): a node's "
                    "k-th step of a window answers that window's k-th slot of prompts and publishes only if "
                    "k < S (later steps train unpublished); a peer's groups beyond n x S per window, or on "
                    "prompts outside them, are refused. The swarm should agree on it: with 30 s windows, 16 "
                    "covers nodes stepping every 2 s.")
    min_peer_temperature: float = Field(
        0.25, gt=0, le=10, description="Peer groups declaring a sampling temperature below this are dropped "
                                       "(`unsupported_temperature`; protocol/validate.py says why).")
    max_peer_temperature: float = Field(
        2.0, gt=0, le=10, description="Peer groups declaring a sampling temperature above this are dropped "
                                      "(`unsupported_temperature`).")
    max_peer_tokens_per_step: int | None = Field(
        None, ge=1, description="Completion tokens of peer groups taken per step (None: max_peer_groups_per_step "
                                "x the largest peer G x generation.max_new_tokens).")
    max_fetch_bytes_per_peer: int | None = Field(
        None, ge=1 << 20, description="Bytes of chunks one peer's index entries can make a gather download (fetched "
                                      "and then dropped or not: a Sybil bound). None: twice the largest encoded group "
                                      "(what one largest group needs), raised to a chunk per max_groups_per_peer slot.")
    allowed_peers: list[str] = Field(
        default_factory=list, description="Closed swarm: take groups only from these peer ids (empty: open swarm).")
    allowed_peers_file: Path | None = Field(
        None, description="Closed swarm: an allow-list signed by the operator key `prompt_set_owner` "
                          "(see `swarm-node allow-list`); its peers are added to allowed_peers.")
    max_record_ttl_s: float = Field(
        3600.0, gt=0, description="DHT records expiring later than now + this are refused (store and read).")
    max_subkeys_per_key: int = Field(256, ge=1, description="Owned records (peers) one replica keeps under one key.")
    max_bytes_per_key: int = Field(256 << 10, ge=1024, description="Bytes of owned records one replica keeps under one key.")
    max_bytes_per_peer: int = Field(256 << 10, ge=1024, description="Bytes of owned records one replica keeps from one peer.")
    send_text: Literal["auto", "always", "never"] = Field(
        "auto", description="Send each completion's text and its tokens' byte lengths with own groups, so peers with "
                            "another tokenizer can re-tokenize them (about 2 bytes a token more on the wire). auto: "
                            "when another tokenizer fingerprint was seen in peers' status records or groups within "
                            "record_ttl_s, and until any peer's fingerprint was seen; always; never.")
    cross_tokenizer: bool = Field(
        True, description="Receiver: take peer groups of another tokenizer by re-tokenizing their text (groups "
                          "without text stay `tokenizer_mismatch`); False: drop every such group.")
    spot_check: SpotCheckConfig = Field(default_factory=SpotCheckConfig, description="Logprob spot-checks.")

    @model_validator(mode="after")
    def _check_ttl(self) -> SwarmConfig:
        if self.record_ttl_s > self.max_record_ttl_s:
            raise ValueError(f"swarm.record_ttl_s ({self.record_ttl_s}) exceeds swarm.max_record_ttl_s "
                             f"({self.max_record_ttl_s}): peers would refuse this node's records")
        if self.min_peer_temperature > self.max_peer_temperature:
            raise ValueError(f"swarm.min_peer_temperature ({self.min_peer_temperature}) exceeds "
                             f"swarm.max_peer_temperature ({self.max_peer_temperature})")
        return self
