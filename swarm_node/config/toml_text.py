"""TOML as text: `section.field=value` overrides onto a nested dict, and a nested dict written back
as TOML (the resolved config a node dumps at start, the node files `swarm-node local` writes).
Standard library only; the config tree (`config.py`) uses both."""

from __future__ import annotations

import tomllib
from typing import Any


def apply_override(data: dict[str, Any], item: str) -> None:
    """Apply one `a.b.c=value` override to a nested dict. The value is parsed as TOML, else kept as a string."""
    if "=" not in item:
        raise ValueError(f"override {item!r} is not of the form section.field=value")
    key, raw = item.split("=", 1)
    parts = key.strip().split(".")
    if not all(parts):
        raise ValueError(f"override {item!r} has an empty key part")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError as e:
        if raw.strip()[:1] in ("\"", "'", "[", "{"):
            raise ValueError(f"override {item!r}: the value is not valid TOML ({e})") from e
        value = raw  # a bare word: taken as a string
    node = data
    for p in parts[:-1]:
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise ValueError(f"override {item!r}: {p!r} is not a section")
    node[parts[-1]] = value


def toml_value(v: Any) -> str:
    """One value as TOML text (bool, number, string, or a list of them)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def to_toml(data: dict[str, Any], prefix: str = "") -> str:
    """A nested dict as TOML text: scalars first, then one [section] per nested dict."""
    scalars = [f"{k} = {toml_value(v)}" for k, v in data.items() if not isinstance(v, dict)]
    out = []
    if scalars:
        if prefix:
            out.append(f"[{prefix}]")
        out.extend(scalars)
        out.append("")
    for k, v in data.items():
        if isinstance(v, dict):
            out.append(to_toml(v, f"{prefix}.{k}" if prefix else k))
    return "\n".join(out)
