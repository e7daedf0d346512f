"""A node's persistent identity: one RSA key that is both its libp2p identity and its record-signing key.

The key lives in the node directory as `identity.key`, in the format the p2p daemon reads for
`identity_path` (a libp2p `PrivateKey` protobuf holding an RSA key in PKCS#1 DER). The same key
signs the node's DHT records (hivemind's `RSASignatureValidator`), so the *owner* of a signed
subkey maps to exactly one peer id: `owner_id(public key)` is the libp2p peer id of that key.
That lets a receiver check that a group's claimed sender is the peer that signed the index
record pointing at it. The file is created on first start (mode 0600, written atomically), so a
node that restarts from the same directory is the same peer and the same owner.

Operators' prompt-set keys use the same file format (`load_or_create_key(path)`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from google.protobuf.message import DecodeError
from hivemind.p2p import PeerID
from hivemind.proto import crypto_pb2
from hivemind.utils.crypto import RSAPrivateKey, RSAPublicKey

from swarm_node.util.atomic import atomic_write_bytes
from swarm_node.util.errors import InputError

IDENTITY_FILENAME = "identity.key"
KEY_FILE_MODE = 0o600
_SHA2_256_MULTIHASH_PREFIX = bytes([0x12, 0x20])  # multihash code sha2-256, digest length 32


@dataclass(frozen=True)
class NodeIdentity:
    """The loaded key and the names derived from it."""

    path: Path
    private_key: RSAPrivateKey
    created: bool = False  # True when this call generated the key (first start)

    @property
    def public_key(self) -> bytes:
        """OpenSSH form (`ssh-rsa AAAA...`), as it appears inside `[owner:...]` subkeys."""
        return self.private_key.get_public_key().to_bytes()

    @property
    def peer_id(self) -> str:
        """Base58 libp2p peer id; equal to the owner id of this key's records."""
        return owner_id(self.public_key)


def owner_id(public_key: bytes | str) -> str:
    """The libp2p peer id (base58) of an RSA public key in OpenSSH form.

    Computed as libp2p specifies: sha2-256 multihash of the protobuf `PublicKey` holding the
    SubjectPublicKeyInfo DER. Raises ValueError for a key that is not RSA or not parseable.
    """
    if isinstance(public_key, str):
        public_key = public_key.encode()
    try:
        key = RSAPublicKey.from_bytes(public_key)._public_key
    except (ValueError, TypeError, IndexError) as e:
        raise ValueError(f"not an RSA public key in OpenSSH form: {e}") from e
    der = key.public_bytes(
        encoding=serialization.Encoding.DER, format=serialization.PublicFormat.SubjectPublicKeyInfo
    )
    proto = crypto_pb2.PublicKey(key_type=crypto_pb2.RSA, data=der).SerializeToString()
    return PeerID(_SHA2_256_MULTIHASH_PREFIX + hashlib.sha256(proto).digest()).to_base58()


def serialize_private_key(key: RSAPrivateKey) -> bytes:
    """The p2p daemon's identity format: protobuf PrivateKey{RSA, PKCS#1 DER}."""
    return crypto_pb2.PrivateKey(key_type=crypto_pb2.KeyType.RSA, data=key.to_bytes()).SerializeToString()


def deserialize_private_key(data: bytes) -> RSAPrivateKey:
    """Inverse of `serialize_private_key`. Raises ValueError on anything else."""
    try:
        proto = crypto_pb2.PrivateKey.FromString(data)
    except DecodeError as e:
        raise ValueError(f"identity file is not a libp2p private key: {e}") from e
    if proto.key_type != crypto_pb2.KeyType.RSA:
        raise ValueError(f"identity key type {proto.key_type} is not RSA")
    key = RSAPrivateKey.__new__(RSAPrivateKey)
    key.__setstate__({"_private_key": proto.data})  # hivemind's documented pickle path: DER -> key
    return key


def load_or_create_key(path: Path) -> NodeIdentity:
    """Load the RSA key at `path`, or create it (0600, atomic) if the file does not exist."""
    path = Path(path)
    if path.exists():
        mode = path.stat().st_mode & 0o777
        if mode & 0o077:
            raise InputError(f"key file {path} is readable by others (mode {mode:o})", f"run: chmod 600 {path}")
        try:
            key = deserialize_private_key(path.read_bytes())
        except (ValueError, OSError) as e:
            raise InputError(f"key file {path} is damaged or not a swarm-node key ({str(e).split('. ')[0][:120]})",
                             "restore it from a backup, or move it away to start with a new identity "
                             "(a new peer id)") from e
        return NodeIdentity(path=path, private_key=key)
    key = RSAPrivateKey()
    atomic_write_bytes(path, serialize_private_key(key), mode=KEY_FILE_MODE)
    return NodeIdentity(path=path, private_key=key, created=True)


def load_node_identity(node_dir: Path) -> NodeIdentity:
    """The identity of the node whose directory is `node_dir` (created on first start)."""
    node_dir = Path(node_dir)
    node_dir.mkdir(parents=True, exist_ok=True)
    return load_or_create_key(node_dir / IDENTITY_FILENAME)


def public_key_text(identity: NodeIdentity) -> str:
    """The public key as text, for operators to hand to nodes (`swarm.prompt_set_owner`)."""
    return identity.public_key.decode()


__all__ = [
    "IDENTITY_FILENAME",
    "NodeIdentity",
    "deserialize_private_key",
    "load_node_identity",
    "load_or_create_key",
    "owner_id",
    "public_key_text",
    "serialize_private_key",
]
