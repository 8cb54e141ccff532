"""How near a quantized GGUF runs to its own weights: perplexity on kwker's public-domain text,
mean KL and top-1 agreement of kwker at a precision, and of llama.cpp, against the file's weights
dequantized to float32 (kwker fp32). With --requantized, also kwker with the K formats turned off
(every matrix requantized into the precision's own format, as before issue 49: no Q4_K blocks
kept, nothing quantized to Q4K).

    python scripts/gguf_quality.py MODEL.gguf [--precision int4] [--tokens 512] [--requantized]
        [--text FILE]

A famous text is one the model nearly knows by heart, where a few tokens decide the perplexity;
--text scores another (the repository's own docs or code, say) in its place.
"""

import argparse
import math
from pathlib import Path

import torch

from kwker.bench.quality import llama_cpp_log_probs, score, text
from kwker.loading.load import load_files
from kwker.loading.tokenizer import load_tokenizer


def kwker_decoder(path, tokens: int, precision: str):
    return load_files(path, max_cache_len=tokens, precision=precision, cache=False)


def log_probs(dec, ids: list[int]) -> torch.Tensor:
    return torch.from_numpy(dec.forward(ids)).double().log_softmax(-1)


def requantized_decoder(path, tokens: int, precision_name: str):
    """kwker with the K formats turned off: every matrix requantized into the precision's own
    format."""
    from kwker import precision

    tables = (precision.KEPT_FORMATS, precision.KEPT_WIDER, precision.KEPT_EMBEDDING_FORMATS,
              precision.QUANTIZED_FORMATS)  # fmt: skip
    kept = [dict(table) for table in tables]
    for table in tables:
        table.clear()
    try:
        return kwker_decoder(path, tokens, precision_name)
    finally:
        for table, k in zip(tables, kept, strict=True):
            table.update(k)


def pooled(rows: list[dict]) -> dict:
    """One row for several texts' rows of one model: perplexity from the mean log-likelihood of
    all their predicted tokens, KL and top-1 over all their positions."""
    predicted = sum(r["tokens"] - 1 for r in rows)
    positions = sum(r["tokens"] for r in rows)
    nll = sum((r["tokens"] - 1) * math.log(r["perplexity"]) for r in rows) / predicted
    return {
        "precision": rows[0]["precision"],
        "tokens": positions,
        "perplexity": math.exp(nll),
        "mean_kl_vs_fp32": sum(r["tokens"] * r["mean_kl_vs_fp32"] for r in rows) / positions,
        "top1_agreement_vs_fp32": sum(r["tokens"] * r["top1_agreement_vs_fp32"] for r in rows)
        / positions,
    }


def print_table(title: str, rows: list[dict]) -> None:
    print(title)
    print("| weights | perplexity | mean KL vs the file's weights | top-1 agreement |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['precision']} | {r['perplexity']:.3f} | {r['mean_kl_vs_fp32']:.4f} | "
              f"{r['top1_agreement_vs_fp32']:.1%} |")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--precision", default="int4")
    ap.add_argument("--tokens", type=int, default=512, help="at most this many tokens a text")
    ap.add_argument("--requantized", action="store_true")
    ap.add_argument("--text", type=Path, nargs="+",
                    help="UTF-8 files (default: kwker's public-domain text)")  # fmt: skip
    args = ap.parse_args()
    tokenizer = load_tokenizer(args.model)
    texts = {str(f): f.read_text(encoding="utf-8") for f in args.text or []}
    texts = texts or {"the public-domain text": text()}
    ids = {name: tokenizer(words)["input_ids"][: args.tokens] for name, words in texts.items()}
    longest = max(len(i) for i in ids.values())
    decoders = {"kwker fp32 (the file's weights)": kwker_decoder(args.model, longest, "fp32")}
    made = [(args.precision, kwker_decoder(args.model, longest, args.precision))]
    if args.requantized:
        made.append((f"{args.precision}, requantized",
                     requantized_decoder(args.model, longest, args.precision)))  # fmt: skip
    for what, dec in made:
        decoders[f"kwker {what} ({dec.weight_bytes_per_token / 1e6:.0f} MB/token)"] = dec
    per_text = []
    for name, text_ids in ids.items():
        t = torch.tensor(text_ids)
        logps = {row: log_probs(d, text_ids) for row, d in decoders.items()}
        logps["llama.cpp, the file"] = llama_cpp_log_probs(args.model, text_ids)
        ref = next(iter(logps.values()))
        rows = [score(row, ref, logp, t) for row, logp in logps.items()]
        print_table(f"{args.model}: {len(text_ids)} tokens of {name}", rows)
        per_text.append(rows)
    if len(per_text) > 1:
        total = sum(len(i) for i in ids.values())
        print_table(f"all {len(per_text)} texts pooled ({total} tokens)",
                    [pooled(list(rows)) for rows in zip(*per_text, strict=True)])  # fmt: skip


if __name__ == "__main__":
    main()
