"""The errors of Kwker's Hub downloads (kwker.models.hub): each says what went wrong and what
to do, in place of huggingface_hub's, the HTTP client's and the OS's own."""

from __future__ import annotations


class DownloadError(RuntimeError):
    pass


class GatedRepoError(DownloadError):
    pass


class DiskFullError(DownloadError):
    pass


class Cancelled(DownloadError):
    pass


class GgufRepo(DownloadError):
    """A repo of GGUF files, asked for as a safetensors model: one of its quants is the model
    (kwker.models.gguf_repo)."""


class Offline(DownloadError):
    """The Hub cannot be reached at all: said at once, not after the client's retries."""
