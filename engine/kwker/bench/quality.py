"""What each precision costs in quality: perplexity on a fixed public-domain text (shipped in the
package), mean KL divergence of the next-token distribution from the fp32 model's, and how often
the top token agrees with fp32's.

`kwker bench --quality [MODEL]` prints the table; the tests bound it on the real SmolLM2-135M.
With `--vs llama.cpp` the table also has llama.cpp's formats of the same weights (those
`kwker bench --vs llama.cpp` runs), scored against the same fp32 reference."""

from __future__ import annotations

import importlib.util
from importlib import resources

import torch

from kwker.precision import COMPUTATIONS, CONVERSIONS, PRECISIONS

# the reference, what a model is converted to, and the other computations on those weights
ROWS = ("fp32", *CONVERSIONS, *COMPUTATIONS)


def text() -> str:
    """Public-domain text: the Gettysburg Address, the opening of A Tale of Two Cities and of
    Moby-Dick."""
    return (
        resources.files("kwker.resources")
        .joinpath("texts/public_domain.txt")
        .read_text(encoding="utf-8")
    )


def measure(
    model,
    tokenizer,
    precisions=ROWS,
    max_tokens: int = 512,
    threads: int | None = None,
    ggufs: dict | None = None,
    kwker_files: dict | None = None,
) -> list[dict]:
    """One row per kwker precision, one per GGUF of kwker_files ({name: path}, loaded by kwker from
    the file at its nearest precision), then one per llama.cpp GGUF of ggufs ({name: path}), all
    against kwker fp32."""
    from kwker.hf.decoder import KwkDecoder

    ids = tokenizer(text(), return_tensors="pt")["input_ids"][0, :max_tokens]

    def log_probs(precision):
        dec = KwkDecoder(model, max_cache_len=len(ids), precision=precision, threads=threads)
        return dec.forward(ids).double().log_softmax(-1)

    reference = log_probs("fp32")
    rows = []

    def row(name, logp):
        rows.append(score(name, reference, logp, ids))

    for precision in precisions:
        row(precision, reference if precision == "fp32" else log_probs(precision))
    for name, path in (kwker_files or {}).items():
        from kwker.loading.load import load_files

        dec = load_files(path, max_cache_len=len(ids), threads=threads, cache=False)
        logp = torch.from_numpy(dec.forward(ids.tolist())).double().log_softmax(-1)
        row(f"{name} ({dec.precision})", logp)
    for name, path in (ggufs or {}).items():
        row(name, llama_cpp_log_probs(path, ids.tolist(), threads))
    return rows


def score(name: str, reference, logp, ids) -> dict:
    """A row of the table: logp ([tokens, vocab] next-token log-probabilities after each of ids)
    scored on the text's next tokens and against the fp32 model's, `reference`."""
    nll = -logp[:-1].gather(1, ids[1:, None]).mean()
    kl = (reference.exp() * (reference - logp)).sum(-1).mean()
    top1 = (reference.argmax(-1) == logp.argmax(-1)).double().mean()
    return {
        "precision": name,
        "tokens": len(ids),
        "perplexity": float(nll.exp()),
        "mean_kl_vs_fp32": float(kl),
        "top1_agreement_vs_fp32": float(top1),
    }


def llama_cpp_log_probs(path, ids: list[int], threads: int | None = None) -> torch.Tensor:
    """llama.cpp's next-token log-probabilities after each of ids (one prefill with every row's
    logits)."""
    import numpy as np
    from llama_cpp import Llama

    from kwker.llama_cpp_amx import keep_llama_cpp_off_amx

    keep_llama_cpp_off_amx()
    llm = Llama(
        model_path=str(path),
        n_ctx=len(ids),
        n_batch=len(ids),
        n_ubatch=len(ids),
        logits_all=True,
        n_threads=threads,
        n_threads_batch=threads,
        verbose=False,
    )
    llm.eval(ids)
    logp = torch.from_numpy(np.array(llm.scores[: len(ids)])).double().log_softmax(-1)
    llm.close()
    return logp


def llama_cpp_ggufs(model_spec) -> dict:
    """{row name: path} of the GGUFs `kwker bench --vs llama.cpp` runs for these weights ({}
    without a source GGUF)."""
    from kwker.bench.peers import peer_gguf, recipe_gguf
    from kwker.models.loader import source_gguf

    src = source_gguf(model_spec)
    if src is None:
        return {}
    formats = dict.fromkeys(f for p in PRECISIONS.values() for f in p.gguf)
    recipes = dict.fromkeys(f for p in PRECISIONS.values() for f in p.llama_quantize)
    return (
        {f"llama.cpp {fmt}": peer_gguf(src, fmt) for fmt in formats}
        | {f"llama.cpp llama-quantize {fmt}": recipe_gguf(src, fmt, 0) for fmt in recipes}
        | {"llama.cpp source file": src}
    )


# The GGUF types kwker reads, written from the same weights: by the gguf package (the first five)
# and by llama.cpp's quantizer (its K-quant and i-quant recipes, when llama-cpp-python is
# installed). Not the IQ2_S and lower i-quants, which llama.cpp writes only with an importance
# matrix it cannot compute here (nor, for some models, IQ3_XXS: its recipe gives
# Qwen2.5-Coder-1.5B's attn_k IQ2_S, and that row is skipped), nor TQ1_0 / TQ2_0, which hold only
# ternary-trained weights (of any other model they keep nothing: scripts/iquant_quality.py,
# perf-notes #44). A recipe keeps the rows whose length is not a multiple of 256 in a 32-value
# type (IQ4_NL for the i-quants): in SmolLM2 (576) and Qwen2.5 0.5B (896) that is most matrices.
FILE_TYPES = ("Q8_0", "Q5_1", "Q5_0", "Q4_1", "Q4_0")
RECIPE_TYPES = ("Q6_K", "Q5_K_M", "Q4_K_M", "Q3_K_M", "Q2_K", "IQ4_NL", "IQ4_XS", "IQ3_S",
                "IQ3_XXS")  # fmt: skip


def kwker_file_rows(model_spec, out=print) -> dict:
    """{row name: path}: a GGUF of these weights in each type kwker maps onto its formats."""
    from kwker.bench.peers import peer_gguf, recipe_gguf
    from kwker.models.loader import source_gguf

    src = source_gguf(model_spec)
    if src is None:
        return {}
    files = {f"kwker from {fmt}": peer_gguf(src, fmt) for fmt in FILE_TYPES}
    if importlib.util.find_spec("llama_cpp") is None:
        out("K-quant files need llama.cpp's quantizer (pip install 'kwker[bench]'): skipped")
        return files
    for fmt in RECIPE_TYPES:
        try:
            files[f"kwker from {fmt}"] = recipe_gguf(src, fmt, 0)
        except RuntimeError as e:  # a recipe that needs an importance matrix for this model
            out(f"kwker from {fmt}: skipped: {str(e).split(': ')[-1]}")
    return files


def run(model_spec=None, threads=None, out=print, peers=()) -> list[dict]:
    from kwker.bench.peers import LLAMA_CPP, LLAMA_CPP_MISSING
    from kwker.models.loader import DEFAULT_MODEL, load_model

    unknown = [p for p in peers if p not in LLAMA_CPP]
    if unknown:
        raise ValueError(f"unknown peer {unknown[0]!r} (the quality table compares with llama.cpp)")
    model, tokenizer = load_model(model_spec, dtype=torch.float32)
    ggufs = {}
    if set(LLAMA_CPP) & set(peers):
        if importlib.util.find_spec("llama_cpp") is None:
            out(f"{LLAMA_CPP_MISSING}: skipped")
        else:
            ggufs = llama_cpp_ggufs(model_spec)
            if not ggufs:
                out("llama.cpp: no GGUF of these weights to convert from: skipped")
    files = kwker_file_rows(model_spec, out)
    rows = measure(model, tokenizer, threads=threads, ggufs=ggufs, kwker_files=files)
    tokens = rows[0]["tokens"]
    out(f"model: {model_spec or DEFAULT_MODEL}, text: {tokens} tokens of public-domain prose")
    out("| weights | perplexity | mean KL vs fp32 (nats) | top-1 agreement vs fp32 |")
    out("|---|---|---|---|")
    for r in rows:
        plain = r["precision"].startswith(("llama.cpp", "kwker from"))
        name = r["precision"] if plain else f"kwker {r['precision']}"
        out(
            f"| {name} | {r['perplexity']:.3f} | {r['mean_kl_vs_fp32']:.4f} | "
            f"{r['top1_agreement_vs_fp32']:.1%} |"
        )
    return rows
