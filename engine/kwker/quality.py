"""Deprecated: kwker.bench.quality. The quality table is part of the benchmark, and the two
imported each other."""

from kwker._deprecation import moved_module
from kwker.bench.quality import (
    FILE_TYPES,
    RECIPE_TYPES,
    ROWS,
    kwker_file_rows,
    llama_cpp_ggufs,
    llama_cpp_log_probs,
    measure,
    run,
    score,
    text,
)

moved_module(__name__, "kwker.bench.quality")
__all__ = [
    "FILE_TYPES", "RECIPE_TYPES", "ROWS", "kwker_file_rows", "llama_cpp_ggufs",
    "llama_cpp_log_probs", "measure", "run", "score", "text",
]  # fmt: skip
