"""Status records: each node's `NodeStatus` under the swarm's status key, read and checked.

A record that does not decode, is not a `NodeStatus`, is signed by another peer than it names,
breaks `protocol.validate` limits, or whose receipts claim more than a node could have done
(`protocol.receipt_rules.claim_reasons`) is dropped and counted as `status_<reason>`.
"""

from __future__ import annotations

from protocol import codec, keys
from protocol.messages import SUPPORTED_VERSIONS, NodeStatus, ProtocolError
from protocol.receipt_rules import claim_reasons
from protocol.validate import ValidationLimits, validate_status
from swarm_node.swarm.transport import DropCounter, Transport

DECODE_ERROR = "decode_error"
BAD_VERSION = "bad_version"
WRONG_TYPE = "wrong_type"
SENDER_MISMATCH = "sender_mismatch"


def decode_reason(data: bytes) -> str:
    """Why `data` failed to decode: `bad_version` for a well-framed message of another version."""
    if len(data) >= 3 and data[:2] == codec.MAGIC and data[2] not in SUPPORTED_VERSIONS:
        return BAD_VERSION
    return DECODE_ERROR


def read_statuses(transport: Transport, swarm_id: str, limits: ValidationLimits, drops: DropCounter,
                  timeout: float) -> list[NodeStatus]:
    """Valid status records of live peers (including this node's), sorted by peer id."""
    out = []
    for owner, item in transport.get_all(keys.status_key(swarm_id), timeout).items():
        try:
            status = codec.decode(item.value)
        except ProtocolError:
            drops.add("status_" + decode_reason(item.value))
            continue
        reason = None
        if not isinstance(status, NodeStatus):
            reason = WRONG_TYPE
        elif status.peer_id != owner:
            reason = SENDER_MISMATCH
        else:
            reasons = validate_status(status, limits) or claim_reasons(status)
            reason = reasons[0] if reasons else None
        if reason is None:
            out.append(status)
        else:
            drops.add("status_" + reason)
    return sorted(out, key=lambda s: s.peer_id)
