"""The package's layers, as its docstring states them: no module imports from a layer above its own,
and the run-time imports (type-only ones aside) form no cycle."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import wyoming_qwen3tts

PACKAGE = Path(wyoming_qwen3tts.__file__).resolve().parent
NAME = PACKAGE.name


def _layers() -> dict[str, int]:
    """'model' -> 2, ... from the package docstring's numbered list."""
    found = re.findall(r"^(\d+)\. \w+: (.+)$", wyoming_qwen3tts.__doc__ or "", re.M)
    assert found, "the package docstring states no layers"
    layers: dict[str, int] = {}
    for number, names in found:
        for name in names.split(","):
            name = name.strip()
            layers[NAME if name == NAME else f"{NAME}.{name}"] = int(number)
    return layers


def _module(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
    path = PACKAGE.parent / name.replace(".", "/")
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _imports() -> list[tuple[str, str, bool]]:
    """(importer, imported module, type-only) for every import of the package's own modules."""
    edges = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = _module(path)
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        tree = ast.parse(path.read_text(), str(path))
        type_only = {
            id(inner)
            for node in ast.walk(tree)
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for inner in ast.walk(node)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                targets = [f"{target}.{a.name}" if _is_module(f"{target}.{a.name}") else target for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            for target in targets:
                if target == NAME or target.startswith(NAME + "."):
                    edges.append((module, target, id(node) in type_only))
    return edges


def _layer_of(module: str, layers: dict[str, int]) -> int:
    """The layer of the longest listed name that is the module or a package holding it."""
    # The package itself (its __init__) is listed by its name alone: it holds no other module's layer.
    best = max(
        (name for name in layers if module == name or (name != NAME and module.startswith(name + "."))),
        key=len,
        default=None,
    )
    assert best is not None, f"{module} is in no layer of the package docstring"
    return layers[best]


def test_every_module_has_a_layer_and_imports_only_downward() -> None:
    layers = _layers()
    edges = _imports()
    assert len(edges) > 100  # the parser found the package's imports
    upward = [
        f"{a} (layer {_layer_of(a, layers)}) imports {b} (layer {_layer_of(b, layers)})"
        for a, b, _ in edges
        if _layer_of(b, layers) > _layer_of(a, layers)
    ]
    assert not upward, "\n".join(upward)


def test_run_time_imports_form_no_cycle() -> None:
    graph: dict[str, set[str]] = {}
    for a, b, type_only in _imports():
        # A package's __init__ importing its own submodules is how a package is built, not a cycle;
        # the benchmark harness (bench/) is developer tooling on its way out of the package.
        if not type_only and a != b and not b.startswith(a + ".") and not a.startswith(f"{NAME}.bench."):
            graph.setdefault(a, set()).add(b)
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(path[path.index(nxt) :] + [nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)


def test_the_parser_resolves_relative_type_only_and_local_imports() -> None:
    edges = set(_imports())
    assert (f"{NAME}.engine", f"{NAME}.model.codec", False) in edges  # from .model.codec import ...
    assert (f"{NAME}.speech", f"{NAME}.service", True) in edges  # under TYPE_CHECKING
    assert (f"{NAME}.backends", f"{NAME}.backends.torch_backend", False) in edges  # inside make_backend
    layers = _layers()
    assert _layer_of(f"{NAME}.voices.__main__", layers) > _layer_of(f"{NAME}.voices.folder", layers)


def test_the_service_knows_no_tensor_library() -> None:
    """Out-of-memory handling is the engine's: the service (and the front ends above it) import no torch."""
    for name in ("service.py", "speech.py", "handler.py", "metrics.py"):
        tree = ast.parse((PACKAGE / name).read_text())
        imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {
            (n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and not n.level
        }
        assert "torch" not in imported, name
