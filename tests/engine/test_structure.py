"""The package's shape: no import cycles among kwker's modules, and the runner's private state
stays its own."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "engine" / "kwker"
NATIVE = "kwker._native"  # the extension module: a submodule without source, importing nothing


def module_names() -> dict[str, Path]:
    """kwker's modules by dotted name (a package by its own name, for its __init__)."""
    names = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def imported(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The kwker modules that `name` imports, ALL of its imports: at module level and inside
    functions (a lazy import closes a cycle as surely, only later). `from package import submodule`
    counts as the submodule (`from kwker import _native` as the native module, not kwker's
    __init__)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package, up level - 1
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in modules or sub == NATIVE else base)
    return {m for m in found if m in modules and m != name}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One import chain per cycle found by a depth-first walk (each as [a, b, ..., a])."""
    state, stack, found = {}, [], []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                found.append(stack[stack.index(nxt) :] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return found


def test_no_import_cycles():
    modules = module_names()
    graph = {name: imported(name, path, modules) for name, path in modules.items()}
    assert "kwker.runner" in graph and graph["kwker.hf.decoder"]  # the walk sees the package
    assert not cycles(graph), "\n".join(" -> ".join(c) for c in cycles(graph))


def test_a_cycle_is_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c", "a"]]


# The runner's records and its native step, reached from outside the runner: the step's methods go
# through the runner's API. `._step` on anything but `self` (runner._step, self.draft.runner._step,
# r._step); an object's own `self._step` (a method of its own) is its business.
PRIVATE = re.compile(r"\._cached\b|\._run\(|(?<!\bself)\._step\b")


def test_the_private_access_pattern_catches_a_step_reached_on_another_object():
    for line in ("runner._step.step()", "self.draft._step", "r._step", "myself._step", "x._cached"):
        assert PRIVATE.search(line), line
    for line in ("self._step()", "self._steps += 1", "self._step_count", "runner.step()"):
        assert not PRIVATE.search(line), line


def test_only_the_runner_touches_slot_records_and_runs_the_step():
    offenders = []
    for folder in (ROOT / "engine", ROOT / "app"):
        for path in folder.rglob("*.py"):
            if path == PACKAGE / "runner.py":
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if PRIVATE.search(line):
                    offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not offenders, "\n".join(offenders)
