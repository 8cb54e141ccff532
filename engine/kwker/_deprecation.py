"""Old import paths and names that keep working for one release, with a DeprecationWarning that
points at the caller's line (pytest turns kwker's own into errors: see pyproject.toml)."""

from __future__ import annotations

import importlib
import warnings

GOES = "the old one goes in the next release"


def moved_module(old: str, new: str) -> None:
    """Warns that the module `old`, which calls this as it is imported, is now `new`."""
    # stacklevel 3: past this function and the old module's body to the line that imported it
    # (warnings skips importlib's own frames on the way)
    warnings.warn(f"{old} is now {new}: import from there ({GOES})", DeprecationWarning, 3)


def old_names(module: str, renamed: dict[str, str], rest: str | None = None):
    """A module __getattr__ for `module`: each old name in `renamed` ({old: "pkg.module.new"})
    warns and gives the new object; with `rest` (the module the old one moved to), any other
    name is looked up there, without a warning (importing the old module gave one)."""

    def __getattr__(name: str):
        if name in renamed:
            new = renamed[name]
            warnings.warn(f"{module}.{name} is now {new} ({GOES})", DeprecationWarning, 2)
            where, _, attr = new.rpartition(".")
            return getattr(importlib.import_module(where), attr)
        if rest is not None and not name.startswith("__"):  # not the import system's probes
            return getattr(importlib.import_module(rest), name)
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__
