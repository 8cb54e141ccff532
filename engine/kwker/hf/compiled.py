"""CompiledDecoder: the KwkDecoder interface (generate, stream_generate, lookup, drafts, sampling)
for a Hugging Face causal LM that the native step does not run, through the model's own forward
exported once and compiled ahead of time.

    dec = CompiledDecoder(model, max_cache_len=256)   # tens of seconds the first time, then cached
    out = dec.generate(input_ids, max_new_tokens=20)

The model's forward with a static KV cache (transformers' StaticCache) is exported with
torch.export for any number of tokens per step (1..max_step_tokens) and compiled by AOTInductor
into a package under kwker's cache folder (`compiled/`), keyed by the model's class and config, a
hash of its weights, max_cache_len, the step size and the torch/transformers versions. Positions
are written into the static cache where they fall, so a rejected speculation is simply
overwritten by the next step (the causal mask never looks past the step's positions). One
sequence at a time (max_batch=1); precision is the model's own dtype.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from kwker.generation import StepDecoder
from kwker.loading.paths import cache_dir
from kwker.precision import canonical, own_precision
from kwker.runner import DEFAULT_LOGIT_ROWS, DEFAULT_STEP_TOKENS


class _StaticCacheForward(torch.nn.Module):
    """model(input_ids [1, T], cache_position [T]) -> logits [1, T, vocab], with the KV cache as
    module buffers (what torch.export needs to carry mutable state into the compiled program)."""

    def __init__(self, model, max_cache_len: int):
        from transformers import StaticCache
        from transformers.cache_utils import StaticLayer, StaticSlidingWindowLayer

        super().__init__()
        self.model = model
        config = model.config.get_text_config()
        self.cache = StaticCache(max_cache_len=max_cache_len, config=config)
        for i, layer in enumerate(self.cache.layers):
            # a sliding layer's ring buffer has data-dependent control flow; a full-length layer
            # with the model's windowed mask gives the same attention
            if isinstance(layer, StaticSlidingWindowLayer):
                self.cache.layers[i] = StaticLayer(max_cache_len)
        heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        head_dim = (
            getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        )
        self.cache.early_initialization(1, heads, head_dim, model.dtype, torch.device("cpu"))
        for i, layer in enumerate(self.cache.layers):
            self.register_buffer(f"keys_{i}", layer.keys, persistent=False)
            self.register_buffer(f"values_{i}", layer.values, persistent=False)
            self.register_buffer(f"length_{i}", layer.cumulative_length, persistent=False)

    def forward(self, input_ids, cache_position):
        for layer in self.cache.layers:
            layer.cumulative_length.copy_(cache_position[0])
        out = self.model(
            input_ids=input_ids,
            cache=self.cache,
            cache_position=cache_position,
            position_ids=cache_position[None],
            use_cache=True,
        )
        return out.logits.float()


def weights_hash(model) -> str:
    h = hashlib.blake2b(digest_size=16)
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(str((t.dtype, tuple(t.shape))).encode())
        h.update(t.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def package_key(model, max_cache_len: int, max_step_tokens: int) -> str:
    import transformers

    desc = {
        "class": type(model).__name__,
        "config": model.config.to_json_string(use_diff=False),
        "weights": weights_hash(model),
        "max_cache_len": max_cache_len,
        "max_step_tokens": max_step_tokens,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "format": 1,
    }
    return hashlib.blake2b(json.dumps(desc, sort_keys=True).encode(), digest_size=16).hexdigest()


def compile_package(model, max_cache_len: int, max_step_tokens: int, path: Path) -> None:
    """Exports and AOT-compiles the static-cache forward into `path` (written whole or not at
    all)."""
    module = _StaticCacheForward(model, max_cache_len).eval()
    n = min(2, max_step_tokens)
    tokens = torch.export.Dim("tokens", min=1, max=max_step_tokens) if max_step_tokens > 1 else None
    shapes = ({1: tokens}, {0: tokens}) if tokens is not None else None
    with torch.no_grad():
        program = torch.export.export(
            module,
            (torch.zeros((1, n), dtype=torch.long), torch.arange(n)),
            dynamic_shapes=shapes,
            strict=True,
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".pt2", dir=path.parent)
        os.close(fd)
        try:
            torch._inductor.aoti_compile_and_package(program, package_path=tmp)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)


class CompiledStep:
    """The native Model's step interface over a compiled package: one sequence (slot 0), T
    consecutive positions."""

    isa = "aoti"

    def __init__(self, model, max_cache_len: int, max_step_tokens: int, folder: Path | None = None):
        self.max_cache_len = max_cache_len
        self.max_step_tokens = max_step_tokens
        self.max_out_rows = min(DEFAULT_LOGIT_ROWS, max_step_tokens)
        self.n_slots = 1
        self.weight_bytes_per_token = sum(p.numel() * p.element_size() for p in model.parameters())
        self.path = (
            folder or cache_dir() / "compiled"
        ) / f"{package_key(model, max_cache_len, max_step_tokens)}.pt2"
        self.compiled_now = not self.path.exists()
        started = time.perf_counter()
        if self.compiled_now:
            compile_package(model, max_cache_len, max_step_tokens, self.path)
        self._program = torch._inductor.aoti_load_package(str(self.path))
        self.build_seconds = time.perf_counter() - started
        self._logits = None

    @property
    def threads(self) -> int:
        return torch.get_num_threads()

    def step(self, tokens, slots, positions, out_rows) -> np.ndarray:
        tokens, positions = np.asarray(tokens), np.asarray(positions)
        T = len(tokens)
        if np.any(np.asarray(slots) != 0):
            raise ValueError("a CompiledDecoder runs one sequence (slot 0)")
        if (
            T < 1
            or T > self.max_step_tokens
            or not np.array_equal(positions, np.arange(positions[0], positions[0] + T))
        ):
            raise ValueError(
                f"a step takes 1..{self.max_step_tokens} tokens at consecutive positions"
            )
        if positions[0] < 0 or positions[-1] >= self.max_cache_len:
            raise ValueError(
                f"positions {positions[0]}..{positions[-1]} outside the cache of "
                f"{self.max_cache_len}"
            )
        with torch.no_grad():
            logits = self._program(
                torch.from_numpy(tokens.astype(np.int64))[None],
                torch.from_numpy(positions.astype(np.int64)),
            )
        self._logits = logits[0, torch.from_numpy(np.asarray(out_rows, dtype=np.int64))]
        return self._logits.argmax(dim=-1).numpy().astype(np.int32)

    def logits(self, rows: int) -> np.ndarray:
        return self._logits[:rows].numpy()


class CompiledDecoder(StepDecoder):
    """KwkDecoder's interface for any Hugging Face causal LM: a StepDecoder over a CompiledStep,
    the model's own forward compiled ahead of time (see the module's doc). `compiled_now` says
    whether this construction compiled (False: loaded from the disk cache)."""

    def __init__(
        self,
        model,
        max_cache_len: int,
        precision: str | None = None,
        max_batch: int = 1,
        max_step_tokens: int = DEFAULT_STEP_TOKENS,
        tokenizer=None,
        cache_folder: str | os.PathLike | None = None,
    ):
        if (
            not isinstance(max_cache_len, int)
            or isinstance(max_cache_len, bool)
            or max_cache_len < 1
        ):
            raise ValueError(f"max_cache_len must be a positive integer, got {max_cache_len!r}")
        limit = getattr(model.config, "max_position_embeddings", None) or getattr(
            model.config, "n_positions", None
        )
        if limit is not None and max_cache_len > limit:
            raise ValueError(
                f"max_cache_len {max_cache_len} is longer than the model's {limit} positions"
            )
        if max_batch != 1:
            raise ValueError(
                f"a CompiledDecoder runs one sequence at a time (max_batch=1), got {max_batch!r}"
            )
        dtype = next(model.parameters()).dtype
        own = own_precision(dtype)
        if own is None:
            raise ValueError(
                f"weights of dtype {dtype} are not supported (float32, bfloat16, float16)"
            )
        precision = canonical(precision)
        if precision not in (None, own):
            raise ValueError(
                f"a CompiledDecoder runs the model's own precision ({own!r}), got {precision!r}; "
                f"convert the model first (model.to(torch.bfloat16))"
            )
        step = CompiledStep(
            model.eval(),
            max_cache_len,
            min(max_step_tokens, max_cache_len),
            None if cache_folder is None else Path(cache_folder),
        )
        self.compiled_now = step.compiled_now
        self.build_seconds = step.build_seconds
        super().__init__(model, step, own, tokenizer)
