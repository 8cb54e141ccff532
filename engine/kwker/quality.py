"""What each precision costs in quality: perplexity on a fixed public-domain text (shipped in the package), mean
KL divergence of the next-token distribution from the fp32 model's, and how often the top token agrees with fp32's.

`kwker bench --quality [MODEL]` prints the table; the tests bound it on the real SmolLM2-135M."""

from __future__ import annotations

from importlib import resources

import torch

PRECISIONS = ("fp32", "bf16", "balanced", "int4")


def text() -> str:
    """Public-domain text: the Gettysburg Address, the opening of A Tale of Two Cities and of Moby-Dick."""
    return resources.files("kwker.resources").joinpath("texts/public_domain.txt").read_text(encoding="utf-8")


def measure(model, tokenizer, precisions=PRECISIONS, max_tokens: int = 512, threads: int | None = None) -> list[dict]:
    from kwker.decode import KwkDecoder

    ids = tokenizer(text(), return_tensors="pt")["input_ids"][0, :max_tokens]
    targets = ids[1:]

    def log_probs(precision):
        dec = KwkDecoder(model, max_cache_len=len(ids), precision=precision, threads=threads)
        return dec.forward(ids).double().log_softmax(-1)

    reference = log_probs("fp32")
    rows = []
    for precision in precisions:
        logp = reference if precision == "fp32" else log_probs(precision)
        nll = -logp[:-1].gather(1, targets[:, None]).mean()
        kl = (reference.exp() * (reference - logp)).sum(-1).mean()
        top1 = (reference.argmax(-1) == logp.argmax(-1)).double().mean()
        rows.append({"precision": precision, "tokens": len(ids), "perplexity": float(nll.exp()),
                     "mean_kl_vs_fp32": float(kl), "top1_agreement_vs_fp32": float(top1)})
    return rows


def run(model_spec=None, threads=None, out=print) -> list[dict]:
    from kwker.models.loader import DEFAULT_MODEL, load_model

    model, tokenizer = load_model(model_spec, dtype=torch.float32)
    rows = measure(model, tokenizer, threads=threads)
    out(f"model: {model_spec or DEFAULT_MODEL}, text: {rows[0]['tokens']} tokens of public-domain prose")
    out("| precision | perplexity | mean KL vs fp32 (nats) | top-1 agreement vs fp32 |")
    out("|---|---|---|---|")
    for r in rows:
        out(f"| {r['precision']} | {r['perplexity']:.3f} | {r['mean_kl_vs_fp32']:.4f} | "
            f"{r['top1_agreement_vs_fp32']:.1%} |")
    return rows
