"""The package's shape: no import cycles among kwker's modules, and the runner's private state
stays its own."""

import re
from pathlib import Path

from import_graph import cycles, imports, module_names

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "engine" / "kwker"


def test_no_import_cycles():
    modules = module_names(PACKAGE)  # the walk of the layers test, whose imports this checks too
    graph = {
        name: {module for module, _ in imports(name, path, modules)} if path else set()
        for name, path in modules.items()
    }
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
