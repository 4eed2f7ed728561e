"""The layering rule, checked on every run (docs/architecture.md states it).

Each module of ``src/kcore`` belongs to one layer; a module imports only from its own layer or
the layers below it, and the three clients (producer, consumer, admin) never import one
another. Every import counts: at module level, inside functions (lazy) and under
``TYPE_CHECKING``. No module imports itself back through a chain of imports (no cycles).
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "kcore"

# Lowest first. A module's layer is that of the longest prefix of its name listed here.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("kcore._version", "kcore.errors", "kcore.types", "kcore._bundle_loader")),
    ("codec", ("kcore._codec", "kcore.codec")),
    # Settings by their Java names (the LZ4 HC check asks the codec) and the metrics registry
    # (its sensors compiled).
    ("settings", ("kcore.config", "kcore.metrics", "kcore._metrics")),
    ("protocol", ("kcore.protocol",)),
    ("network", ("kcore.network",)),
    ("cluster", ("kcore.cluster",)),
    ("clients", ("kcore.producer", "kcore.consumer", "kcore.admin")),
    # The package's __init__: the public names, loaded lazily from the clients.
    ("facade", ("kcore",)),
    ("applications", ("kcore.spark", "kcore.cli", "kcore.testing", "kcore.__main__")),
]
RANK = {prefix: rank for rank, (_, prefixes) in enumerate(LAYERS) for prefix in prefixes}
# Packages of one layer that must not import one another.
SIBLINGS = {"clients": ("kcore.producer", "kcore.consumer", "kcore.admin")}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _owner(module: str) -> str | None:
    """The listed prefix a module belongs to (the longest match)."""
    best = None
    for prefix in RANK:
        if module == prefix or module.startswith(prefix + "."):
            if best is None or len(prefix) > len(best):
                best = prefix
    return best


def _imports(path: Path, module: str) -> set[str]:
    """Every kcore module ``path`` imports, wherever the import stands."""
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "kcore")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                if not is_package:
                    base = base[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "kcore":
                continue
            # ``from kcore.x import y`` imports the submodule kcore.x.y where there is one;
            # otherwise a name of kcore.x itself.
            for alias in node.names:
                candidate = f"{target}.{alias.name}"
                found.add(candidate if _exists(candidate) else target)
    found.discard(module)
    return found


def _exists(module: str) -> bool:
    path = SRC.joinpath(*module.split("."))
    return (
        any(path.with_suffix(s).exists() for s in (".py", ".pyx"))
        or (path / "__init__.py").exists()
    )


def _graph() -> dict[str, set[str]]:
    graph = {}
    for path in PACKAGE.rglob("*.py"):
        if "protocol/messages" in path.as_posix():
            continue  # generated: imports protocol.types only (checked by the generator test)
        module = _module_name(path)
        graph[module] = _imports(path, module)
    return graph


def test_every_module_belongs_to_a_layer():
    unplaced = sorted(m for m in _graph() if _owner(m) is None)
    assert not unplaced, f"modules in no layer (add them to LAYERS): {unplaced}"


def test_imports_point_down_and_clients_do_not_import_each_other():
    wrong = []
    for module, targets in sorted(_graph().items()):
        owner = _owner(module)
        assert owner is not None
        for target in sorted(targets):
            target_owner = _owner(target)
            if target_owner is None:
                continue
            if RANK[target_owner] > RANK[owner]:
                wrong.append(f"{module} -> {target} (up: {owner} is below {target_owner})")
            elif RANK[target_owner] == RANK[owner] and target_owner != owner:
                layer = LAYERS[RANK[owner]][0]
                if target_owner in SIBLINGS.get(layer, ()) and owner in SIBLINGS[layer]:
                    wrong.append(f"{module} -> {target} (sibling clients)")
    assert not wrong, "imports against the layering:\n" + "\n".join(wrong)


def test_no_import_cycles():
    graph = _graph()
    # Package __init__ modules re-export their children; an __init__ importing its own
    # children is not a cycle of design, so those edges are left out.
    edges = {
        m: {t for t in ts if t in graph and not t.startswith(m + ".")} for m, ts in graph.items()
    }
    cycles = []
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join(stack[stack.index(nxt) :] + [nxt]))
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)
