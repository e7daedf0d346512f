"""Typed readers of one msgpack field of a message body (`schema`): each returns the value or raises
ProtocolError naming the field, within the bounds it is given."""

from __future__ import annotations

from typing import Any

import numpy as np

from protocol.limits import Limits
from protocol.messages import ProtocolError

_INT_MIN, _INT_MAX = -(2**63), 2**63 - 1


def str_field(v: Any, what: str, max_len: int) -> str:
    """`v` as a str of at most `max_len` bytes UTF-8 encoded (a bound in bytes, not characters)."""
    if not isinstance(v, str):
        raise ProtocolError(f"{what}: expected str, got {type(v).__name__}")
    size = len(v) if len(v) > max_len or len(v) * 4 <= max_len else len(v.encode("utf-8", "surrogatepass"))
    if size > max_len:
        raise ProtocolError(f"{what}: string of {size} bytes or more exceeds {max_len}")
    return v


def int_field(v: Any, what: str, lo: int = _INT_MIN, hi: int = _INT_MAX) -> int:
    if not isinstance(v, (int, np.integer)) or isinstance(v, bool):
        raise ProtocolError(f"{what}: expected int, got {type(v).__name__}")
    if not lo <= v <= hi:
        raise ProtocolError(f"{what}: {v} outside [{lo}, {hi}]")
    return int(v)


def float_field(v: Any, what: str, strict: bool) -> float:
    ok = isinstance(v, float) or (not strict and isinstance(v, (int, np.integer, np.floating)))
    if not ok or isinstance(v, bool):
        raise ProtocolError(f"{what}: expected float, got {type(v).__name__}")
    return float(v)


def bool_field(v: Any, what: str) -> bool:
    if not isinstance(v, bool):
        raise ProtocolError(f"{what}: expected bool, got {type(v).__name__}")
    return v


def bytes_field(v: Any, what: str, max_len: int) -> bytes:
    if not isinstance(v, bytes):
        raise ProtocolError(f"{what}: expected bytes, got {type(v).__name__}")
    if len(v) > max_len:
        raise ProtocolError(f"{what}: {len(v)} bytes exceeds {max_len}")
    return v


def seq_field(v: Any, what: str, max_len: int, exact: int | None = None) -> list[Any] | tuple[Any, ...]:
    if not isinstance(v, (list, tuple)):
        raise ProtocolError(f"{what}: expected array, got {type(v).__name__}")
    if exact is not None and len(v) != exact:
        raise ProtocolError(f"{what}: expected {exact} fields, got {len(v)}")
    if len(v) > max_len:
        raise ProtocolError(f"{what}: {len(v)} items exceeds {max_len}")
    return v


def digests_field(v: Any, limits: Limits) -> tuple[str, ...]:
    items = seq_field(v, "chunk_digests", limits.max_chunk_digests)
    return tuple(str_field(d, "digest", limits.max_string_len) for d in items)
