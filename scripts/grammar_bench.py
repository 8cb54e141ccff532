"""Constrained decoding on a key-heavy JSON schema: tokens per step and tokens/s with the
grammar's forced tokens proposed (Kwker's default) and not (Constraint.forced patched to give
none), and llama.cpp (llama-cpp-python) on the same GGUF file and schema. Greedy, medians.

    python scripts/grammar_bench.py [GGUF] [--repeats 5] [--precision int4]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import jsonschema

from kwker.constrained import Constraint
from kwker.models.loader import load_decoder, resolve_model

KEYS = ["customer_full_name", "customer_email_address", "shipping_street_address",
        "shipping_postal_code", "preferred_delivery_window", "gift_wrapping_requested",
        "loyalty_program_member", "order_priority_level"]  # fmt: skip
SCHEMA = {
    "type": "object",
    "properties": {
        **{k: {"type": "string", "maxLength": 24} for k in KEYS[:5]},
        "gift_wrapping_requested": {"type": "boolean"},
        "loyalty_program_member": {"type": "boolean"},
        "order_priority_level": {"enum": ["standard", "express", "overnight"]},
    },
    "required": KEYS,
    "additionalProperties": False,
}
QUESTION = (
    "Fill in the order form as JSON for Jane Doe (jane@example.com), 12 Elm Street, 90210, "
    "delivery in the morning, with gift wrapping, a loyalty member, express."
)


def kwker_runs(decoder, ids, repeats: int, forced: bool) -> list[tuple[float, float, str]]:
    """(tokens per step, tokens/s, text) per run."""
    original = Constraint.forced
    if not forced:
        Constraint.forced = lambda self: []
    try:
        out = []
        for _ in range(repeats):
            t0, tokens, stats = time.perf_counter(), [], None
            for c in decoder.stream_generate(ids, 300, json_schema=SCHEMA, lookup=0):
                tokens.append(c.token)
                stats = c.stats
            seconds = time.perf_counter() - t0 - stats.prefill_s
            text = decoder.tokenizer.decode(tokens, skip_special_tokens=True)
            out.append((len(tokens) / stats.steps, len(tokens) / seconds, text))
        return out
    finally:
        Constraint.forced = original


def llama_cpp_runs(path: str, question: str, repeats: int, schema) -> list[tuple[float, str]]:
    """(decode tokens/s: from the first token to the last, text) per run; schema None: free."""
    from llama_cpp import Llama

    llm = Llama(path, n_ctx=1024, n_threads=2, verbose=False)
    fmt = {"type": "json_object", "schema": schema} if schema else None
    out = []
    for _ in range(repeats):
        first, n, text = None, 0, ""
        for part in llm.create_chat_completion(
            [{"role": "user", "content": question}], temperature=0, max_tokens=300,
            response_format=fmt, stream=True,
        ):  # fmt: skip
            piece = part["choices"][0]["delta"].get("content")
            if piece:
                n += 1
                first = first or time.perf_counter()
                text += piece
        out.append(((n - 1) / (time.perf_counter() - first), text))
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model", nargs="?", default="Qwen/Qwen2.5-Coder-0.5B-Instruct")
    p.add_argument("--precision", default="int4")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    decoder = load_decoder(args.model, max_cache_len=1024, precision=args.precision)
    ids = decoder.tokenizer.apply_chat_template(
        [{"role": "user", "content": QUESTION}], add_generation_prompt=True
    )
    ids = ids["input_ids"] if isinstance(ids, dict) else ids
    print(f"{args.model} ({args.precision}, kwker's {decoder.runner.isa} kernels)")
    texts = {}
    for forced in (True, False) * 3:  # alternating: both see the same machine
        runs = kwker_runs(decoder, ids, args.repeats, forced)
        texts.setdefault(forced, runs[0][2])
        steps = statistics.median(r[0] for r in runs)
        rate = statistics.median(r[1] for r in runs)
        print(f"kwker, forced proposals {'on ' if forced else 'off'}: {steps:.2f} tokens/step, "
              f"{rate:.1f} tokens/s (decode)")  # fmt: skip
    assert texts[True] == texts[False], "forced proposals changed the text"
    jsonschema.validate(json.loads(texts[True]), SCHEMA)
    print("kwker's answer:", texts[True])
    path = str(resolve_model(args.model))
    if path.endswith(".gguf"):
        free = llama_cpp_runs(path, QUESTION, args.repeats, None)
        runs = llama_cpp_runs(path, QUESTION, args.repeats, SCHEMA)
        rate = statistics.median(r[0] for r in runs)
        plain = statistics.median(r[0] for r in free)
        print(f"llama.cpp (llama-cpp-python, its GBNF from the schema): {rate:.1f} tokens/s "
              f"(decode), {plain:.1f} without the schema")  # fmt: skip
        try:
            jsonschema.validate(json.loads(runs[0][1]), SCHEMA)
            print("llama.cpp's answer validates:", runs[0][1])
        except (ValueError, jsonschema.ValidationError) as e:
            print("llama.cpp's answer does not validate:", e, runs[0][1])


if __name__ == "__main__":
    main()
