"""Moved to kwker.bench.quality: the quality table is part of the benchmark, and the two imported
each other. This name keeps working, with a DeprecationWarning, for one release."""

import warnings

from kwker.bench.quality import (  # noqa: F401 (re-exported)
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

warnings.warn(
    "kwker.quality moved to kwker.bench.quality; import it from there",
    DeprecationWarning,
    stacklevel=2,
)
