"""A download's progress: the bytes of all its files (Progress, with speed and ETA), counted
from huggingface_hub's progress bars and Kwker's own transfers (Tally), which is also where a
cancel from another thread is noticed."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from kwker.models.hub_errors import Cancelled
from kwker.models.hub_files import RepoFile


@dataclass
class Progress:
    file: str
    done: int  # bytes of all files, including those already on disk
    total: int
    speed: float  # bytes/s over this session
    eta_s: float | None


class Tally:
    """The bytes of one download() call, reported as Progress. hf_hub_download's progress bars
    (bar_class) feed it, so it is also where a cancel is noticed, inside a transfer."""

    def __init__(self, repo_id: str, total: int, progress, cancelled: Callable[[], bool]):
        self.repo_id, self.total = repo_id, total
        self.progress, self.cancelled = progress, cancelled
        self.started = time.monotonic()
        self.fetched = 0  # bytes received in this call, for the speed
        self.before = 0  # bytes of the files before the current one
        self.file, self.size, self.done = "", 0, 0  # the current file, and its bytes so far
        self.bar_class = _counting_bar(self)

    def check(self) -> None:
        if self.cancelled():
            raise Cancelled(
                f"download of {self.repo_id} cancelled; run it again to continue (the files "
                f"finished so far are kept)"
            )

    def begin(self, f: RepoFile) -> None:
        self.check()
        self.file, self.size, self.done = f.name, f.size, 0

    def add(self, n: int) -> None:
        """n bytes more of the current file (fewer when huggingface_hub starts a file over)."""
        self.check()
        self.fetched += max(n, 0)
        self.done = min(max(self.done + n, 0), self.size)  # a retry's bytes are not counted twice
        self.report()

    def restart(self) -> None:  # the file is fetched again from its first byte
        self.done = 0

    def resume_at(self, n: int) -> None:
        """The current file's transfer starts at byte n (n bytes were kept from before)."""
        self.check()
        self.done = min(n, self.size)
        self.report()

    def end(self) -> None:
        self.before += self.size
        self.done = 0
        self.report()

    def report(self) -> None:
        if not self.progress:
            return
        done = self.before + self.done
        speed = self.fetched / max(time.monotonic() - self.started, 1e-6)
        eta = (self.total - done) / speed if speed else None
        self.progress(Progress(self.file, done, self.total, speed, eta))


def _counting_bar(tally: Tally):
    """A tqdm class for hf_hub_download's tqdm_class that shows nothing (Kwker shows its own
    progress) and gives its byte counts to tally."""
    from tqdm import tqdm

    class CountingBar(tqdm):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **{**kwargs, "disable": True})

        def update(self, n=1):  # bytes written to the file
            tally.add(int(n or 0))

        # Bytes received from the network: having these makes huggingface_hub use one bar per
        # file for Xet downloads too, so update() alone counts each byte once
        def update_transfer(self, n=1):
            tally.check()

        def set_transfer_postfix_str(self, postfix, refresh=False):
            pass

    return CountingBar
