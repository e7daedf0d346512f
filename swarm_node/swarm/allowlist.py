"""Operator-signed allow-lists of peer identities, for closed swarms.

The file is JSON: `{"swarm_id": ..., "peers": [peer id, ...], "signature": "<base64>"}`; the operator
signs the canonical JSON of swarm id and sorted peers with the same RSA key that signs prompt sets
(`swarm.prompt_set_owner`). A node configured with `swarm.allowed_peers_file` takes peer groups
only from the listed identities (`admission.NOT_ALLOWED` for the rest). A file that does not verify
stops the node with one line saying why.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from hivemind.utils.crypto import RSAPublicKey

from swarm_node.util.atomic import atomic_write_bytes
from swarm_node.util.errors import InputError
from swarm_node.swarm.identity import NodeIdentity


class AllowListError(InputError):
    """An allow-list file that cannot be read or does not verify against the operator key (one line, exit 2)."""


def _signing_bytes(swarm_id: str, peers: list[str]) -> bytes:
    return json.dumps({"swarm_id": swarm_id, "peers": sorted(set(peers))}, sort_keys=True,
                      separators=(",", ":")).encode()


def write_allow_list(path: Path, swarm_id: str, peers: Iterable[str], operator: NodeIdentity) -> list[str]:
    """Sign `peers` for `swarm_id` with the operator key and write the file atomically."""
    peers = sorted(set(peers))
    signature = operator.private_key.sign(_signing_bytes(swarm_id, peers))
    doc = {"swarm_id": swarm_id, "peers": peers, "signature": signature.decode()}
    atomic_write_bytes(Path(path), (json.dumps(doc, indent=1) + "\n").encode())
    return peers


def load_allow_list(path: Path, swarm_id: str, operator_public_key: str | bytes | None) -> list[str]:
    """The peers of a signed allow-list; raises AllowListError if unreadable, unsigned or foreign."""
    if operator_public_key is None:
        raise AllowListError("swarm.allowed_peers_file needs swarm.prompt_set_owner (the operator key that signed it)")
    try:
        doc = json.loads(Path(path).read_text())
        peers, signature = doc["peers"], doc["signature"].encode()
        listed_swarm = doc["swarm_id"]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise AllowListError(f"cannot read allow-list {path}: {e}") from e
    if not isinstance(peers, list) or not all(isinstance(p, str) for p in peers):
        raise AllowListError(f"allow-list {path}: `peers` must be a list of peer ids")
    if listed_swarm != swarm_id:
        raise AllowListError(f"allow-list {path} is for swarm {listed_swarm!r}, not {swarm_id!r}")
    key = operator_public_key.encode() if isinstance(operator_public_key, str) else operator_public_key
    try:
        ok = RSAPublicKey.from_bytes(key).verify(_signing_bytes(swarm_id, peers), signature)
    except (ValueError, TypeError, IndexError) as e:
        raise AllowListError(f"swarm.prompt_set_owner is not an RSA public key: {e}") from e
    if not ok:
        raise AllowListError(f"allow-list {path} is not signed by the configured operator key")
    return sorted(set(peers))
