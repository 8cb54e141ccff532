"""The curated model catalog (resources/catalog.json, shipped in the wheel): what each model is, and
which models share a tokenizer (the drafts a model can use)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from functools import cache
from importlib.resources import files

from kwker.loading import memory


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
    # The keys of the Hub repo's config.json that shape its memory, and its torch_dtype (the
    # precision of "the model's own" before any file is on disk). Every repo listed is bfloat16:
    # its safetensors take 2 bytes a parameter (download_bytes), and the shapes agree with the
    # GGUFs the PyPI packages carry (SmolLM2-135M, Qwen2.5-Coder, Gemma 3 270M) and with params.
    # A GGUF repo's entry (gguf) states no dtype: its own precision is its default quant's.
    config: dict = field(default_factory=dict, compare=False)
    # the sampling the model answers well at where its files say nothing (kwker.models.presets)
    preset: dict = field(default_factory=dict, compare=False)
    base: bool = False  # a base model: it continues text, it does not answer (no chat template)
    # a repo of GGUF files: the model is one of its quants (kwker.models.gguf_repo), chosen in
    # the picker's quant list; download_bytes is its default quant's file
    gguf: bool = False
    quant: str | None = None  # that default quant, when it is not Q4_K_M

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


@cache
def facts(e: CatalogEntry) -> memory.ModelFacts:
    """What the memory estimate needs of e, from its config (no file read); a GGUF repo's own
    precision is its default quant's."""
    facts = memory.facts_from_config(e.config)
    if e.gguf:
        from kwker.models.gguf_repo import DEFAULT_QUANT, own_precision

        facts = dataclasses.replace(facts, own=own_precision(e.quant or DEFAULT_QUANT))
    return facts


def memory_estimate(e: CatalogEntry, precision: str | None, context: int) -> memory.MemoryEstimate:
    """The memory e takes at `precision` (None or "auto": its own dtype) with `context` tokens."""
    return facts(e).estimate(precision, context)


def memory_needed(e: CatalogEntry, precision: str | None, context: int) -> float:
    """Bytes of RAM to run e (kwker.loading.memory: packed weights, the KV cache at its real dtype,
    the step's scratch, the tokenizer and the app's runtime)."""
    return float(memory_estimate(e, precision, context).total)


def available_memory() -> float:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024.0
    return float("inf")


FIT_LABELS = ("fits", "tight", "won't fit")


def fit_of(need: float, available: float | None = None) -> str:
    """ "fits", "tight" or "won't fit" for `need` bytes on this machine's free memory (like Jan's
    pills): tight from 70% of MemAvailable on, won't fit from 95%."""
    have = available or available_memory()
    return "fits" if need < 0.7 * have else ("tight" if need < 0.95 * have else "won't fit")


def fit(
    e: CatalogEntry, precision: str | None, context: int, available: float | None = None
) -> str:
    return fit_of(memory_needed(e, precision, context), available)
