"""The curated model catalog (resources/catalog.json, shipped in the wheel): what each model is, and which models
share a tokenizer (the drafts a model can use)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib.resources import files

from kwker.precision import weight_bytes


@dataclass(frozen=True)
class CatalogEntry:
    id: str
    family: str
    params: float
    download_bytes: int
    license: str
    tokenizer: str  # models with the same value share a tokenizer
    draft: str | None = None
    gated: bool = False
    offline_source: str | None = None
    layers: int = 0
    kv_heads: int = 0
    head_dim: int = 0

    @property
    def runs_natively(self) -> bool:
        from kwker.families import FAMILIES

        return self.family in FAMILIES


@cache
def catalog() -> tuple[CatalogEntry, ...]:
    data = json.loads(files("kwker.resources").joinpath("catalog.json").read_text())
    return tuple(CatalogEntry(**m) for m in data["models"])


def entry(model_id: str) -> CatalogEntry | None:
    return next((e for e in catalog() if e.id == model_id), None)


def same_tokenizer(model_id: str) -> list[str]:
    """Other catalog models that share model_id's tokenizer, smallest first (draft candidates)."""
    me = entry(model_id)
    if me is None:
        return []
    return [
        e.id
        for e in sorted(catalog(), key=lambda e: e.params)
        if e.tokenizer == me.tokenizer and e.id != me.id and e.params < me.params
    ]


OVERHEAD_BYTES = 450e6  # Python, torch, transformers and the decoder's scratch


def memory_needed(e: CatalogEntry, precision: str, context: int) -> float:
    """Bytes of RAM to run e: packed weights + float32 KV cache for `context` tokens + the runtime."""
    kv = 2 * e.layers * e.kv_heads * e.head_dim * 4 * context
    return e.params * weight_bytes(precision) + kv + OVERHEAD_BYTES


def available_memory() -> float:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024.0
    return float("inf")


def fit(e: CatalogEntry, precision: str, context: int, available: float | None = None) -> str:
    """ "fits", "tight" or "won't fit" on this machine's free memory (like Jan's pills)."""
    need, have = memory_needed(e, precision, context), available or available_memory()
    return "fits" if need < 0.7 * have else ("tight" if need < 0.95 * have else "won't fit")
