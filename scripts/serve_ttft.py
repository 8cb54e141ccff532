"""Time to first token per turn of a growing conversation through `kwker serve`, with its prompt
cache and without (every slot's cache cleared before each turn, as admission did before the
cache). Each turn adds a user message of about 250 tokens; answers are greedy, 48 tokens.

    python scripts/serve_ttft.py [MODEL] [--turns 6] [--precision int4]
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time

import httpx
import uvicorn

from kwker.models.loader import load_decoder
from kwker.serve import ServingEngine, create_app

PARAGRAPH = (
    "Turn {n}. Here is more of the report we are reviewing together. The committee met on a "
    "rainy Tuesday and went through the budget line by line: travel, equipment, the new lab "
    "space, the visiting speakers and the cost of keeping the old servers running for another "
    "year. Several members asked whether the maintenance contract could be renegotiated, and "
    "the treasurer promised figures by the end of the month. The discussion then turned to the "
    "hiring plan, the summer school and the open house, which drew more visitors than expected. "
    "Two students presented their projects, one on soil moisture sensors and one on a small "
    "language model for the library's catalogue, and the board asked both to report again in "
    "the spring. The minutes close with a list of open questions about parking and the cafe. "
    "Please summarise what changed since the previous part, in two sentences."
)


def serve(decoder):
    engine = ServingEngine(decoder, decoder.tokenizer, max_active=2)
    engine.start()
    config = uvicorn.Config(create_app(engine, "m"), port=8791, log_level="warning")
    server = uvicorn.Server(config)
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    return engine, server


def conversation(url: str, turns: int, clear) -> list[tuple[int, float, int]]:
    """(prompt tokens, time to first token in s, tokens reused) per turn."""
    messages, out = [], []
    for n in range(1, turns + 1):
        messages.append({"role": "user", "content": PARAGRAPH.format(n=n)})
        clear()
        body = {"messages": messages, "max_tokens": 48, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}}  # fmt: skip
        t0, first, text, usage = time.perf_counter(), None, "", None
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=600) as r:
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                data = json.loads(line[6:])
                if data["choices"] and data["choices"][0]["delta"].get("content"):
                    first = first or time.perf_counter() - t0
                    text += data["choices"][0]["delta"]["content"]
                usage = data.get("usage") or usage
        messages.append({"role": "assistant", "content": text})
        out.append((usage["prompt_tokens"], first, usage["kwker"]["reused_prompt_tokens"]))
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model", nargs="?", default="Qwen/Qwen2.5-Coder-0.5B-Instruct")
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--precision", default="int4")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    decoder = load_decoder(args.model, max_cache_len=2048, precision=args.precision, max_batch=4)
    engine, server = serve(decoder)
    url = "http://127.0.0.1:8791"
    runs = {"cache": [], "no cache": []}
    for _ in range(args.repeats):
        for name in runs:  # alternating, so that both see the same machine
            engine.decoder.runner.reset()  # idle between conversations: no slot is in use
            clear = engine.decoder.runner.reset if name == "no cache" else (lambda: None)
            runs[name].append(conversation(url, args.turns, clear))
    print(f"{args.model} ({args.precision}); median of {args.repeats} conversations")
    print("turn  prompt  ttft cache (reused)  ttft no cache")
    for t in range(args.turns):
        prompt = runs["cache"][0][t][0]
        cached = statistics.median(r[t][1] for r in runs["cache"])
        reused = runs["cache"][0][t][2]
        plain = statistics.median(r[t][1] for r in runs["no cache"])
        print(f"{t + 1:4d}  {prompt:6d}  {cached:8.3f} s ({reused:5d})  {plain:8.3f} s")
    server.should_exit = True
    engine.stop()


if __name__ == "__main__":
    main()
