"""The one sanitiser for text from peers: `inert(value)` before any view prints or renders it.

Peers choose the bytes of their records: a status record's model id, addresses, tokenizer
fingerprint and metric keys, a receipt's receiver and model. Printed as sent, an escape sequence
clears a terminal or rewrites what it shows, a bidirectional override (U+202E) makes a string read
backwards, a newline forges a log line. `inert` writes every character that is not printable as
its escape (`\\x1b`, `\\u202e`, `\\n`), the way Python's repr does, and leaves the rest: control
characters (C0, DEL, C1), format characters (bidi controls, zero-width characters), separators other
than the space, surrogates, private-use and unassigned code points.

Every view uses it: `status` and `status --given` (observe/observer.py, observe/given_view.py,
whose rich tables also take cells as `rich.text.Text`, so brackets are never read as markup),
`status --peers` (ledger_view.py), the dashboard's API (observe/dashboard/server.py), the report
(report.py), Prometheus labels (prometheus.py) and the log (ops/cli/common.py formats every message
through it, and the one error line a command prints). Machine output (`--json`) keeps the exact
strings: JSON escapes control characters itself.
"""

from __future__ import annotations

__all__ = ["inert"]


_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(c: str) -> str:
    n = ord(c)
    return _SHORT.get(c) or (f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}")


def inert(value: object, max_chars: int | None = None) -> str:
    """`str(value)` with every non-printable character written as its escape; at most `max_chars`
    characters of the result when given (a cut never leaves anything but printable text)."""
    text = value if isinstance(value, str) else str(value)
    if not text.isprintable():
        text = "".join(c if c.isprintable() else _escape(c) for c in text)
    return text if max_chars is None else text[:max_chars]
