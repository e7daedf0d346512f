"""The import graph of swarm_node/ and protocol/, read from the source with `ast` (nothing is imported):
no cycle between modules, lazy imports (inside functions) and `TYPE_CHECKING` imports included; no
module imports another module's `_private` name; `protocol/` imports the standard library, msgpack,
numpy and zstandard only (no torch, no hivemind, nothing of swarm_node).

An edge is "module A names module B in an import": `import x.y` and `from x import y` (y a module)
give x.y; `from x import name` (name not a module) gives x, the package's `__init__` for a package.
Relative imports are resolved against A's package. The parent packages that Python also runs on
`import x.y` are not edges: a package's `__init__` re-exporting its own modules is not a cycle.

Run: `.venv/bin/python -m pytest -q tests/unit/test_imports.py` (docs/architecture.md, "Imports").
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("swarm_node", "protocol")
PROTOCOL_THIRD_PARTY = ("msgpack", "numpy", "zstandard")  # all protocol/ may import beside the standard library


@dataclass(frozen=True)
class Import:
    module: str  # the importing module
    target: str  # the module or package named (absolute)
    names: tuple[str, ...]  # the names taken from it (`from target import ...`), empty for `import target`
    line: int


@cache
def module_files() -> dict[str, Path]:
    """Every module of the product, by dotted name (a package by its own name)."""
    files = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).with_suffix("")
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            files[".".join(parts)] = path
    return files


def _is_package(name: str, files: dict[str, Path]) -> bool:
    return name in files and files[name].name == "__init__.py"


def imports_of(name: str, path: Path, files: dict[str, Path]) -> Iterator[Import]:
    """Every import statement of a module, wherever it stands (top level, functions, TYPE_CHECKING)."""
    package = name if _is_package(name, files) else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(name, alias.name, (), node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            yield Import(name, base, tuple(a.name for a in node.names), node.lineno)


@cache
def all_imports() -> list[Import]:
    files = module_files()
    return [imp for name, path in files.items() for imp in imports_of(name, path, files)]


def graph(imports: list[Import], files: dict[str, Path]) -> dict[str, dict[str, int]]:
    """module -> {imported module of the product: first line naming it}."""
    edges: dict[str, dict[str, int]] = {name: {} for name in files}
    for imp in imports:
        targets = [f"{imp.target}.{n}" if f"{imp.target}.{n}" in files else imp.target for n in imp.names]
        for target in targets or [imp.target]:
            if target in files and target != imp.module:
                edges[imp.module].setdefault(target, imp.line)
    return edges


def find_cycle(edges: dict[str, dict[str, int]]) -> list[str] | None:
    """One cycle of the graph as [a, b, ..., a], or None (iterative depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for root in sorted(edges):
        if root in state:
            continue
        path, stack = [root], [iter(sorted(edges[root]))]
        state[root] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            elif nxt not in state:
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(edges[nxt])))
    return None


def test_the_reader_sees_lazy_relative_type_checking_and_private_uses(tmp_path: Path):
    """The reader itself: a lazy import, a relative one, `from package import module` and a
    TYPE_CHECKING import each give their edge; a cycle among them is found; a private name taken
    from another module, by import or off the module, is caught."""
    edges = graph(all_imports(), module_files())
    assert "swarm_node.policy.trainer" in edges["swarm_node.node.assemble"]  # lazy, inside _build_parts
    assert "swarm_node.tasks.prompts" in edges["swarm_node.tasks"]  # under TYPE_CHECKING
    assert "protocol.codec" in edges["protocol"]
    sources = {"swarm_node/__init__.py": "",
               "swarm_node/a.py": "from typing import TYPE_CHECKING\nfrom . import b\nfrom .b import x\n"
                                  "if TYPE_CHECKING:\n    from swarm_node.d import T\n"
                                  "def f():\n    import swarm_node.c as c\n    return b._hidden, c._secret\n",
               "swarm_node/b.py": "from swarm_node.c import _lock, public\nx = 1\n",
               "swarm_node/c.py": "def g():\n    from swarm_node import a\n",
               "swarm_node/d.py": "T = int\n"}
    files = {}
    for rel, text in sources.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
        files[rel.removesuffix(".py").removesuffix("/__init__").replace("/", ".")] = tmp_path / rel
    found = list(imports_of("swarm_node.a", files["swarm_node.a"], files))
    assert [(i.target, i.names) for i in found] == [
        ("typing", ("TYPE_CHECKING",)), ("swarm_node", ("b",)), ("swarm_node.b", ("x",)),
        ("swarm_node.d", ("T",)), ("swarm_node.c", ())]
    fake = graph([i for m, p in files.items() for i in imports_of(m, p, files)], files)
    assert fake["swarm_node.a"].keys() == {"swarm_node.b", "swarm_node.c", "swarm_node.d"}
    assert find_cycle(fake) == ["swarm_node.a", "swarm_node.b", "swarm_node.c", "swarm_node.a"]
    uses = [u.split(": ", 1)[1] for u in private_uses(files, root=tmp_path)]
    assert sorted(uses) == ["_lock from swarm_node.c", "swarm_node.b._hidden", "swarm_node.c._secret"]
    assert find_cycle({"a": {"b": 1}, "b": {}, "c": {"a": 1, "b": 1}}) is None


def test_no_import_cycles():
    files = module_files()
    edges = graph(all_imports(), files)
    cycle = find_cycle(edges)
    assert cycle is None, "import cycle: " + " -> ".join(
        f"{a} (line {edges[a][b]})" for a, b in zip(cycle, cycle[1:])) + f" -> {cycle[-1]}"


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_uses(files: dict[str, Path], root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> list[str]:
    """Every use of another product module's `_private` name: imported (`from m import _x`, a module
    `m._x`), or read off an imported module (`m._x` where `m` names a module of the product)."""
    out = []
    for name, path in files.items():
        where = path.relative_to(root)
        aliases: dict[str, str] = {}  # local name -> product module it names
        for imp in imports_of(name, path, files):
            if imp.target.split(".")[0] not in packages:
                continue
            if any(_private(part) for part in imp.target.split(".")[1:]):
                out.append(f"{where}:{imp.line}: module {imp.target}")
            out += [f"{where}:{imp.line}: {n} from {imp.target}" for n in imp.names
                    if _private(n) and imp.target != name]
            aliases.update({n: f"{imp.target}.{n}" for n in imp.names if f"{imp.target}.{n}" in files})
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                aliases.update({a.asname: a.name for a in node.names if a.asname and a.name in files})
            elif (isinstance(node, ast.Attribute) and _private(node.attr) and isinstance(node.value, ast.Name)
                  and node.value.id in aliases and aliases[node.value.id] != name):
                out.append(f"{where}:{node.lineno}: {aliases[node.value.id]}.{node.attr}")
    return out


def test_no_module_imports_another_modules_private_names():
    found = private_uses(module_files())
    assert not found, "private names used across modules:\n" + "\n".join(found)


def test_protocol_imports_only_the_standard_library_msgpack_numpy_and_zstandard():
    """protocol/ stays auditable on its own: no torch, no hivemind, nothing of swarm_node."""
    allowed = set(sys.stdlib_module_names) | {"protocol", *PROTOCOL_THIRD_PARTY}
    found = [i for i in all_imports() if i.module.split(".")[0] == "protocol"]
    bad = [f"{i.module} line {i.line} imports {i.target}" for i in found if i.target.split(".")[0] not in allowed]
    assert found and not bad, "\n".join(bad)


# The layers of the product, lowest first (docs/architecture.md, "The tree"): a module may import its
# own package and any package of a lower layer, never one of its own layer or above. Leaves first.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("protocol", "swarm_node.metric_names", "swarm_node.util", "swarm_node.config"),
    ("swarm_node.method", "swarm_node.tasks"),
    ("swarm_node.policy", "swarm_node.swarm"),
    ("swarm_node.evaluation", "swarm_node.peers"),
    ("swarm_node.observe",),
    ("swarm_node.node",),
    ("swarm_node.experiment",),
    ("swarm_node.ops",),
    ("swarm_node.__main__",),  # `python -m swarm_node`: the command line
)
LEAF_ORDER = ("swarm_node.metric_names", "protocol", "swarm_node.util", "swarm_node.config")  # leaves, among themselves


def unit_of(module: str) -> str | None:
    """The layered unit a module belongs to (its package, or a top-level leaf module); None for the
    top package's own `__init__`."""
    for layer in LAYERS:
        for unit in layer:
            if module == unit or module.startswith(unit + "."):
                return unit
    return None


def rank_of(unit: str) -> tuple[int, int]:
    layer = next(i for i, names in enumerate(LAYERS) if unit in names)
    return layer, (LEAF_ORDER.index(unit) if layer == 0 else 0)


def layer_violations(edges: dict[str, dict[str, int]]) -> list[str]:
    """Every import from a unit into one that is not strictly lower (or within its own unit)."""
    out = []
    for module, targets in sorted(edges.items()):
        src = unit_of(module)
        for target, line in sorted(targets.items()):
            dst = unit_of(target)
            if src is None or dst is None or src == dst:
                continue
            if rank_of(dst) >= rank_of(src) or (rank_of(dst)[0] == rank_of(src)[0] and rank_of(src)[0] > 0):
                out.append(f"{module} (line {line}) imports {target}: {src} may not import {dst}")
    return out


def test_every_module_belongs_to_a_layer():
    loose = [m for m in module_files() if m != "swarm_node" and unit_of(m) is None]
    assert not loose, f"modules outside every layer (add them to LAYERS and docs/architecture.md): {loose}"


def test_imports_run_down_the_layers():
    """Lazy and TYPE_CHECKING imports included; a fake edge upward is caught."""
    edges = graph(all_imports(), module_files())
    bad = layer_violations(edges)
    assert not bad, "imports that run up the layers:\n" + "\n".join(bad)
    assert layer_violations({"swarm_node.policy.trainer": {"swarm_node.node.parts": 3}})
    assert layer_violations({"swarm_node.peers.ledger": {"swarm_node.evaluation.stats": 3}})  # same layer
    assert layer_violations({"swarm_node.util.jsonl": {"swarm_node.config": 3}})  # leaves in their order
    assert not layer_violations({"swarm_node.node.loop": {"swarm_node.policy.types": 3}})


def test_at_most_eight_modules_directly_in_swarm_node():
    top = sorted(p.name for p in (ROOT / "swarm_node").glob("*.py"))
    assert len(top) <= 8, f"modules directly in swarm_node/ (find them a package): {top}"


def test_tests_take_no_private_name_of_the_product():
    """Tests use what the product makes public (a renamed private name would otherwise break only in
    the test run that imports it)."""
    files = dict(module_files())
    for path in sorted((ROOT / "tests").rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        files[".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)] = path
    product = tuple(f"{p}." for p in PACKAGES)
    found = [u for u in private_uses(files, packages=(*PACKAGES, "tests")) if u.startswith("tests/")
             and u.split(": ", 1)[1].split(" from ")[-1].removeprefix("module ").startswith(product)]
    assert not found, "tests using the product's private names:\n" + "\n".join(found)
