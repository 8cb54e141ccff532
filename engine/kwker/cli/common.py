"""What the `kwker` commands share: how they say what they are doing."""

import sys


def progress(msg: str) -> None:
    """A step of a long command (loading, downloading), on stderr so stdout stays the answer."""
    print(f"[kwker] {msg}", file=sys.stderr, flush=True)
