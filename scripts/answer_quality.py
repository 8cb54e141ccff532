"""How a model answers a new user's first questions: right answers out of factual questions, and
loops out of open prompts, at the sampling settings the app would use.

    python scripts/answer_quality.py HuggingFaceTB/SmolLM2-135M-Instruct --precision int4 \
        --temperature 0.7 --top-p 0.9 --repetition-penalty 1.0
    python scripts/answer_quality.py Qwen/Qwen2.5-Coder-1.5B-Instruct --preset

--preset takes the model's own sampling preset (kwker.models.presets: the GGUF's general.sampling.*,
the folder's generation_config.json, the catalog's entry), as the app does; flags given beside it
win. Each prompt runs with seeds 1..--seeds; a factual answer is right when it names the expected
answer (a regular expression, case-insensitive); an open answer loops when it reaches the token
cap with an 8-token run repeated 4 times or more (kwker.models.presets.looped). Prints one line per
answer and the totals.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time

# (question, what a right answer names)
FACTUAL = [
    ("What is the capital of France?", r"\bparis\b"),
    ("What is the capital of Japan?", r"\btokyo\b"),
    ("How many legs does a spider have?", r"\b(8|eight)\b"),
    ("Who wrote Romeo and Juliet?", r"shakespeare"),
    ("What is the chemical symbol for gold?", r"\bau\b"),
    ("Which planet is known as the Red Planet?", r"\bmars\b"),
    ("At what temperature in Celsius does water boil at sea level?", r"\b100\b"),
    ("How many days are there in a leap year?", r"\b366\b"),
    ("What is the largest ocean on Earth?", r"pacific"),
    ("Who painted the Mona Lisa?", r"leonardo|da vinci"),
    ("What is 12 times 12?", r"\b144\b"),
    ("Which gas do plants take in from the air for photosynthesis?", r"carbon dioxide|co2|co₂"),
    ("What is the square root of 81?", r"\b(9|nine)\b"),
    ("On which continent is Kenya?", r"\bafrica\b"),
    ("At what temperature in Fahrenheit does water freeze?", r"\b32\b"),
    ("What language is spoken in Brazil?", r"portuguese"),
    ("How many continents are there?", r"\b(7|seven)\b"),
    ("What is the capital of Italy?", r"\brome\b"),
    ("Which element has the atomic number 1?", r"hydrogen"),
    ("What is the tallest mountain in the world?", r"everest"),
]

OPEN = [
    "Tell me about the history of the Roman Empire.",
    "Write a short story about a robot who learns to paint.",
    "Explain how a car engine works.",
    "What are some tips for staying productive while working from home?",
    "Describe a perfect weekend.",
    "Write a poem about the ocean.",
    "Explain photosynthesis to a child.",
    "What are the pros and cons of social media?",
    "Give me a recipe for pancakes.",
    "How do I learn a new language?",
    "Write an email to my landlord about a broken heater.",
    "What is machine learning?",
]


def main(argv=None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from kwker.app.settings import DEFAULTS, generation_options
    from kwker.models.loader import load_decoder
    from kwker.models.presets import looped, model_preset

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("model")
    p.add_argument("--precision", default="int4")
    p.add_argument("--preset", action="store_true", help="start from the model's own preset")
    p.add_argument("--temperature", type=float)
    p.add_argument("--top-p", type=float)
    p.add_argument("--top-k", type=int)
    p.add_argument("--min-p", type=float)
    p.add_argument("--repetition-penalty", type=float)
    p.add_argument("--seeds", type=int, default=1, help="seeds per prompt (1..N)")
    p.add_argument("--max-new-tokens", type=int, default=512)
    p.add_argument("--only", choices=("factual", "open"), default=None)
    args = p.parse_args(argv)

    dec = load_decoder(args.model, precision=args.precision, max_cache_len=2048)
    sampling = {"temperature": 0.7, "top_p": 0.9, "top_k": 0, "min_p": 0.0,
                "repetition_penalty": 1.0}  # fmt: skip
    if args.preset:
        sampling.update(model_preset(dec, args.model).values)
    for key in sampling:
        if getattr(args, key) is not None:
            sampling[key] = getattr(args, key)
    print(f"# {args.model} at {dec.precision}: {sampling}", flush=True)

    def ask(question: str, seed: int, cap: int) -> tuple[str, int]:
        ids = list(
            dec.tokenizer.apply_chat_template(
                [{"role": "user", "content": question}],
                add_generation_prompt=True,
                return_dict=True,
            )["input_ids"]
        )
        # the app's own mapping of its settings onto the engine's options (lookup as the app's)
        opts = generation_options({**DEFAULTS, **sampling, "seed": seed})
        out = dec.generate(ids, cap, **opts)[0, len(ids) :].tolist()
        return dec.tokenizer.decode(out, skip_special_tokens=True), out

    started = time.perf_counter()
    right = asked = loops = opened = 0
    if args.only != "open":
        for question, expected in FACTUAL:
            for seed in range(1, args.seeds + 1):
                text, _ = ask(question, seed, 96)
                ok = re.search(expected, text, re.IGNORECASE) is not None
                right, asked = right + ok, asked + 1
                print(f"{'RIGHT' if ok else 'WRONG'} {question!r}: {text[:120]!r}", flush=True)
    if args.only != "factual":
        for prompt in OPEN:
            for seed in range(1, args.seeds + 1):
                text, out = ask(prompt, seed, args.max_new_tokens)
                loop = looped(out, args.max_new_tokens)
                loops, opened = loops + loop, opened + 1
                tail = text[-100:].replace("\n", " ")
                print(f"{'LOOP ' if loop else 'ok   '} {len(out):4d} tokens {prompt!r}: …{tail!r}",
                      flush=True)  # fmt: skip
    took = time.perf_counter() - started
    print(f"right {right}/{asked}, loops {loops}/{opened} ({took:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
