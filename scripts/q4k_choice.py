"""int4's format for weights it must quantize: Q4K (4.625 bits a weight) against Q4 (5 bits), from
the same near-float weights (perf-notes #48). Per matrix, the relative RMS error of each format on
a GGUF's Q8_0, Q6_K and float tensors; with --quality, also the model's perplexity, mean KL and
top-1 against the file's weights at fp32 when those tensors are quantized either way (the file's
Q4_K tensors stay kept in both).

    python scripts/q4k_choice.py MODEL.gguf [--rows 256] [--quality]
"""

import argparse

import gguf
import numpy as np

from kwker import _native, precision

SOURCES = ("Q8_0", "Q6_K", "F16", "F32", "BF16")


def matrix_errors(path: str, rows: int) -> None:
    totals = {"Q4": [0.0, 0.0], "Q4K": [0.0, 0.0]}
    for t in gguf.GGUFReader(path).tensors:
        k, n = int(t.shape[0]), int(t.shape[-1])
        if t.tensor_type.name not in SOURCES or len(t.shape) != 2 or k % 256:
            continue
        if t.name.startswith("token_embd"):
            continue
        r = min(n, rows)
        raw = np.asarray(t.data).reshape(n, -1)[:r].reshape(-1).view(np.uint8)
        w = _native.ggml_dequantize(raw, int(t.tensor_type), r, k)
        errors = []
        for fmt in totals:
            d = _native.kernel_weights(w, getattr(_native.WType, fmt)) - w
            e2, s2 = (
                float((d.astype(np.float64) ** 2).sum()),
                float((w.astype(np.float64) ** 2).sum()),
            )
            totals[fmt][0] += e2
            totals[fmt][1] += s2
            errors.append(np.sqrt(e2 / s2))
        print(f"{t.name:28s} {t.tensor_type.name:5s} {r}x{k}: Q4 {errors[0]:.4f}  Q4K "
              f"{errors[1]:.4f}  ratio {errors[1] / errors[0]:.3f}")  # fmt: skip
    if totals["Q4"][1] == 0:
        print("no tensor of", ", ".join(SOURCES), "with rows of a multiple of 256 values")
        return
    q4, q4k = (np.sqrt(totals[f][0] / totals[f][1]) for f in ("Q4", "Q4K"))
    print(f"all: Q4 {q4:.4f}  Q4K {q4k:.4f}  ratio {q4k / q4:.3f} (0.375 bits at 6 dB a bit: "
          f"{2**0.375:.3f})")  # fmt: skip


def model_quality(path: str) -> None:
    import torch
    from gguf_quality import kwker_decoder, log_probs

    from kwker.bench.quality import score, text
    from kwker.loading.tokenizer import load_tokenizer

    ids = load_tokenizer(path)(text())["input_ids"][:512]
    tokens = torch.tensor(ids)
    ref = log_probs(kwker_decoder(path, len(ids), "fp32"), ids)
    # the file's Q6_K matrices are quantized (not kept) in both rows below
    kept = dict(precision.KEPT_FORMATS)
    precision.KEPT_FORMATS.pop(("Q4", "Q6_K"), None)
    quantized = dict(precision.QUANTIZED_FORMATS)
    print("| quantized as | perplexity | mean KL | top-1 | MB a token |")
    print("|---|---|---|---|---|")
    try:
        for fmt in ("Q4K", "Q4"):
            if fmt == "Q4":
                precision.QUANTIZED_FORMATS.clear()
            dec = kwker_decoder(path, len(ids), "int4")
            logp = log_probs(dec, ids)
            r = score(fmt, ref, logp, tokens)
            mb = dec.weight_bytes_per_token / 1e6
            print(f"| {fmt} | {r['perplexity']:.3f} | {r['mean_kl_vs_fp32']:.4f} | "
                  f"{r['top1_agreement_vs_fp32']:.1%} | {mb:.0f} |")  # fmt: skip
    finally:
        precision.KEPT_FORMATS.update(kept)
        precision.QUANTIZED_FORMATS.update(quantized)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--rows", type=int, default=256, help="rows of each tensor measured")
    ap.add_argument("--quality", action="store_true", help="also the model-level quality")
    args = ap.parse_args()
    matrix_errors(args.model, args.rows)
    if args.quality:
        model_quality(args.model)


if __name__ == "__main__":
    main()
