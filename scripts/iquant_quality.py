"""A real model in each GGUF i-quant and ternary type, as llama.cpp's quantizer writes it: does
Kwker load it, answer sensibly, and what does the type cost (the rows of `kwker bench --quality`)?

    . .venv/bin/activate && python scripts/iquant_quality.py \\
        ~/.cache/kwker/models/Qwen--Qwen2.5-Coder-1.5B-Instruct/qwen2.5-coder-1.5b-instruct.gguf \\
        [--types IQ4_NL,IQ4_XS,...] [--precisions auto,balanced] [--baseline] [--vs-llama-cpp] \\
        [--tokens 512] [--threads 2] [--json out.json]

Each file is written beside the source once (kwker.bench.peers.recipe_gguf, the files the
quality table reads), then loaded by Kwker at its nearest precision (kwker.loading.build
GGUF_PRECISION). The reference is Kwker fp32 on the source file, which the quality table's
transformers fp32 equals bit for bit (tests/engine/test_file_loading.py); the text and the scores
are kwker.bench.quality's. A type llama.cpp refuses (the IQ2/IQ1 types without an importance
matrix) is reported with its reason. Each row also shows the mix of types the recipe wrote
(llama.cpp keeps rows whose length is not a multiple of 256 in a 32-value type) and a greedy answer
to a question.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from pathlib import Path

import gguf
import numpy as np
import torch

from kwker.bench import quality
from kwker.bench.peers import recipe_gguf
from kwker.loading.load import load_files

TYPES = "IQ4_NL IQ4_XS IQ3_S IQ3_XXS IQ2_S IQ2_XS IQ2_XXS IQ1_M IQ1_S TQ2_0 TQ1_0".split()
QUESTION = "What is the capital of France? Answer in one sentence."


def type_mix(path: Path) -> str:
    """The share of the matrices' weights in each ggml type, most first."""
    counts: collections.Counter = collections.Counter()
    for t in gguf.GGUFReader(path).tensors:
        if len(t.shape) == 2:
            counts[t.tensor_type.name] += int(t.n_elements)
    total = sum(counts.values())
    return ", ".join(f"{name} {n / total:.0%}" for name, n in counts.most_common())


def log_probs(dec, ids: list[int]) -> torch.Tensor:
    return torch.from_numpy(np.asarray(dec.forward(ids))).double().log_softmax(-1)


def answer(dec) -> str:
    messages = [{"role": "user", "content": QUESTION}]
    ids = dec.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids  # transformers 5: a BatchEncoding
    dec.reset()
    out = dec.generate(ids, max_new_tokens=24)[0, len(ids) :]
    return dec.tokenizer.decode(out, skip_special_tokens=True).strip().replace("\n", " ")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", type=Path, help="the GGUF to quantize (any type llama.cpp reads)")
    parser.add_argument("--types", default=",".join(TYPES))
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--precisions",
        default="auto",
        help="comma-separated precisions each file runs at (auto: its nearest, as load's)",
    )
    parser.add_argument(
        "--baseline", action="store_true", help="also the source file at its nearest precision"
    )
    parser.add_argument(
        "--vs-llama-cpp", action="store_true", help="also llama.cpp's scores on each file"
    )
    args = parser.parse_args(argv)
    src = args.source.expanduser()
    ref_dec = load_files(src, precision="fp32", threads=args.threads, cache=False)
    ids = ref_dec.tokenizer(quality.text())["input_ids"][: args.tokens]
    reference = log_probs(ref_dec, ids)
    rows = [quality.score("fp32 (source file)", reference, reference, torch.tensor(ids))]
    rows[0] |= {"mix": type_mix(src), "answer": answer(ref_dec)}
    del ref_dec
    precisions = [None if p == "auto" else p for p in args.precisions.split(",")]

    def run(path: Path, name: str, extra: dict) -> None:
        for precision in precisions:
            start = time.perf_counter()
            dec = load_files(path, precision=precision, threads=args.threads, cache=False)
            loaded = time.perf_counter() - start
            logp = log_probs(dec, ids)
            row = quality.score(f"{name} ({dec.precision})", reference, logp, torch.tensor(ids))
            row |= extra | {"mix": type_mix(path), "answer": answer(dec), "load_s": round(loaded)}
            rows.append(row)
            print(json.dumps(row), flush=True)
            del dec

    def llama_cpp(path: Path, name: str) -> None:
        logp = quality.llama_cpp_log_probs(path, ids, args.threads)
        row = quality.score(f"llama.cpp on {name}", reference, logp, torch.tensor(ids))
        rows.append(row | {"mix": type_mix(path), "answer": ""})
        print(json.dumps(row), flush=True)

    if args.baseline:
        run(src, "kwker from the source file", {"bytes": src.stat().st_size})
    for fmt in filter(None, args.types.split(",")):
        start = time.perf_counter()
        try:
            path = recipe_gguf(src, fmt, args.threads or 0)
        except RuntimeError as e:
            print(f"{fmt}: llama.cpp did not write it: {str(e)[-160:]}", flush=True)
            rows.append({"precision": f"kwker from {fmt}", "refused": str(e)[-160:]})
            continue
        written = round(time.perf_counter() - start)
        run(path, f"kwker from {fmt}", {"bytes": path.stat().st_size, "quantize_s": written})
        if args.vs_llama_cpp:
            llama_cpp(path, fmt)
    print(f"model: {src.name}, text: {len(ids)} tokens of public-domain prose")
    print("| weights | perplexity | mean KL vs fp32 (nats) | top-1 agreement vs fp32 | file MB | "
          "matrices | answer |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        if "refused" in r:
            print(f"| {r['precision']} | llama.cpp refused: {r['refused'].split(': ')[-1]} |||||")
            continue
        mb = f"{r['bytes'] / 1e6:.0f}" if "bytes" in r else ""
        scores = f"{r['perplexity']:.3f} | {r['mean_kl_vs_fp32']:.4f} | "
        scores += f"{r['top1_agreement_vs_fp32']:.1%}"
        print(f"| {r['precision']} | {scores} | {mb} | {r['mix']} | {r['answer'][:60]} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
