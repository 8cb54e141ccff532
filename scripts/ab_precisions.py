"""Min-of-N A/B of precisions in one process (perf-notes #22): decoders of SmolLM2-135M at each
precision, used in turn, each round a prefill of 512 tokens of the shipped text and 64 one-token
steps. The best round of each is what it gets without interference, on a machine another benchmark
shares.

    python scripts/ab_precisions.py bf16,bf16-dot [--rounds 12] [--threads 2]
"""

import argparse
import os
import time

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    from kwker.bench import quality
    from kwker.hf.decoder import KwkDecoder
    from kwker.models import load_model

    parser = argparse.ArgumentParser()
    parser.add_argument("precisions")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    model, tokenizer = load_model(None, dtype=torch.float32)
    ids = tokenizer(quality.text(), return_tensors="pt")["input_ids"][0, :512].tolist()
    decoders = {
        p: KwkDecoder(model, max_cache_len=600, precision=p, threads=args.threads)
        for p in args.precisions.split(",")
    }
    best = {p: [float("inf"), float("inf")] for p in decoders}  # (prefill, steps) seconds
    for _ in range(args.rounds):
        for p, dec in decoders.items():
            dec.reset()
            t0 = time.perf_counter()
            dec.forward(ids)
            t1 = time.perf_counter()
            for i in range(64):
                dec.forward([ids[i]], start=len(ids) + i)
            t2 = time.perf_counter()
            best[p] = [min(best[p][0], t1 - t0), min(best[p][1], t2 - t1)]
    for p, (pp, tg) in best.items():
        print(f"{p}: pp512 {len(ids) / pp:.1f} tokens/s, tg64 {64 / tg:.1f} tokens/s")


if __name__ == "__main__":
    main()
