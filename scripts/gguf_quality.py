"""How near a quantized GGUF runs to its own weights: perplexity on kwker's public-domain text,
mean KL and top-1 agreement of kwker at a precision, and of llama.cpp, against the file's weights
dequantized to float32 (kwker fp32). With --requantized, also kwker with the K formats turned off
(every matrix requantized into the precision's own format, as before issue 49: no Q4_K blocks
kept, nothing quantized to Q4K).

    python scripts/gguf_quality.py MODEL.gguf [--precision int4] [--tokens 512] [--requantized]
"""

import argparse

import torch

from kwker.bench.quality import llama_cpp_log_probs, score, text
from kwker.loading.load import load_files
from kwker.loading.tokenizer import load_tokenizer


def kwker_log_probs(path, ids: list[int], precision: str) -> torch.Tensor:
    dec = load_files(path, max_cache_len=len(ids), precision=precision, cache=False)
    return torch.from_numpy(dec.forward(ids)).double().log_softmax(-1), dec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--precision", default="int4")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--requantized", action="store_true")
    args = ap.parse_args()
    ids = load_tokenizer(args.model)(text())["input_ids"][: args.tokens]
    ref, _ = kwker_log_probs(args.model, ids, "fp32")
    t = torch.tensor(ids)
    rows = [score("kwker fp32 (the file's weights)", ref, ref, t)]
    logp, dec = kwker_log_probs(args.model, ids, args.precision)
    rows.append(score(f"kwker {args.precision} ({dec.weight_bytes_per_token / 1e6:.0f} MB/token)",
                      ref, logp, t))  # fmt: skip
    if args.requantized:
        from kwker import precision

        tables = (precision.KEPT_FORMATS, precision.KEPT_EMBEDDING_FORMATS,
                  precision.QUANTIZED_FORMATS)  # fmt: skip
        kept = [dict(table) for table in tables]
        for table in tables:
            table.clear()
        try:
            logp, dec = kwker_log_probs(args.model, ids, args.precision)
        finally:
            for table, k in zip(tables, kept, strict=True):
                table.update(k)
        name = (
            f"kwker {args.precision}, requantized ({dec.weight_bytes_per_token / 1e6:.0f} MB/token)"
        )
        rows.append(score(name, ref, logp, t))
    rows.append(score("llama.cpp, the file", ref, llama_cpp_log_probs(args.model, ids), t))
    print(f"{args.model}: {len(ids)} tokens")
    print("| weights | perplexity | mean KL vs the file's weights | top-1 agreement |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['precision']} | {r['perplexity']:.3f} | {r['mean_kl_vs_fp32']:.4f} | "
              f"{r['top1_agreement_vs_fp32']:.1%} |")  # fmt: skip


if __name__ == "__main__":
    main()
