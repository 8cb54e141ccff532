"""The torch wing: Kwker for a transformers model object already in memory.

    from kwker.hf import KwkDecoder, install
    dec = KwkDecoder(model, max_cache_len=2048, precision="int4")   # the native step, packed now
    install(model)                                                  # or: model.generate, natively

- decoder: KwkDecoder(model), install / uninstall, unsupported_reason(model, max_cache_len)
- compiled: CompiledDecoder(model), the same interface for a causal LM the native step does not
  run (its own forward, exported and compiled ahead of time)
- generate: how install routes transformers' generate through a decoder
- torch_ops: install() puts every float32 CPU nn.Linear on the native kernels, no decoder at all

Models from files need none of this, nor torch: kwker.load(spec).
"""

from __future__ import annotations

import importlib

# name -> its module; imported at first use, so that `import kwker.hf.torch_ops` loads no
# transformers and `import kwker.hf` no torch
_EXPORTS = {
    "KwkDecoder": "kwker.hf.decoder",
    "install": "kwker.hf.decoder",
    "uninstall": "kwker.hf.generate",
    "unsupported_reason": "kwker.hf.decoder",
    "CompiledDecoder": "kwker.hf.compiled",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'kwker.hf' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted({*globals(), *_EXPORTS})
