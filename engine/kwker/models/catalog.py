"""The curated model catalog (resources/catalog.json, shipped in the wheel): what each model is, and which models
share a tokenizer (the drafts a model can use)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib.resources import files


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
    return [e.id for e in sorted(catalog(), key=lambda e: e.params) if e.tokenizer == me.tokenizer and e.id != me.id
            and e.params < me.params]
