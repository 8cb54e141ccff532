"""The app's log, in its data folder: Python's logging to `kwker.log` (rotated), and faulthandler
to `crash.log`, so that a crash in native code (Qt, the decoder) still leaves a trace a user can
send. Help is in About, which names both files."""

from __future__ import annotations

import faulthandler
import logging
import logging.handlers
from pathlib import Path

LOG_NAME, CRASH_NAME = "kwker.log", "crash.log"
_crash_file = None  # kept open: faulthandler writes to it from a signal handler


def start(folder: Path) -> Path:
    """Starts logging into folder (made if missing); returns the log's path. Failing to open the
    files (a read-only folder) leaves logging to stderr: the app runs on."""
    global _crash_file
    path = folder / LOG_NAME
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handler = logging.handlers.RotatingFileHandler(
            path, maxBytes=2_000_000, backupCount=2, encoding="utf-8"
        )
        _crash_file = open(folder / CRASH_NAME, "a", encoding="utf-8")  # noqa: SIM115
    except OSError as e:
        logging.basicConfig()
        logging.getLogger(__name__).warning("no log file in %s: %s", folder, e)
        return path
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    faulthandler.enable(_crash_file, all_threads=True)
    logging.getLogger(__name__).info("Kwker started; crashes are written to %s", _crash_file.name)
    return path
