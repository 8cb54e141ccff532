"""The import graph of a package, for the structure and layers tests: its modules, each one's
imports of the others (module level and inside functions, with their lines), and its cycles."""

import ast
from pathlib import Path

NATIVE = "kwker._native"  # the extension module: a submodule without source, importing nothing


def module_names(package: Path) -> dict[str, Path | None]:
    """The package's modules by dotted name (a package by its own name, for its __init__), and
    the native module, which has no source."""
    names = {NATIVE: None}
    for path in package.rglob("*.py"):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def imports(name: str, path: Path, modules: dict) -> list[tuple[str, int]]:
    """(module, line) of each kwker module that `name` imports, ALL of its imports: at module level
    and inside functions. `from package import submodule` counts as the submodule."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package, up level - 1
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            subs = (f"{base}.{alias.name}" for alias in node.names)
            targets = [sub if sub in modules else base for sub in subs]
        else:
            continue
        found += [(t, node.lineno) for t in targets if t in modules and t != name]
    return list(dict.fromkeys(found))  # one per line, however many names it takes


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
