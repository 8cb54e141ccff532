"""Tool calls on 20 prompts: how many answers call a tool, name the right one and give arguments
that validate against its schema; with Kwker's constrained arguments, without them (the same
model, the calls only parsed), and through llama.cpp's server (llama-cpp-python) on the same GGUF.

    python scripts/tool_call_eval.py kwker            # Kwker, with and without constraints
    python scripts/tool_call_eval.py llamacpp --chat-format chatml-function-calling
    python scripts/tool_call_eval.py llamacpp         # the GGUF's own (jinja) template

Greedy answers, at most 256 tokens, tool_choice auto. Prints one line per prompt and the counts
as JSON (the figures of docs/perf-notes.md)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import jsonschema

MODEL = "Qwen/Qwen2.5-Coder-1.5B-Instruct"
GGUF = Path.home() / ".cache/kwker/models/Qwen--Qwen2.5-Coder-1.5B-Instruct"
GGUF /= "qwen2.5-coder-1.5b-instruct.gguf"


def fn(name, description, properties, required):
    params = {"type": "object", "properties": properties, "required": required}
    return {"type": "function",
            "function": {"name": name, "description": description, "parameters": params}}  # fmt: skip


S, N = {"type": "string"}, {"type": "number"}
TOOLS = [
    fn("get_weather", "Current weather in a city",
       {"city": S, "unit": {"enum": ["celsius", "fahrenheit"]}}, ["city"]),
    fn("convert_currency", "Convert an amount of money between currencies",
       {"amount": N, "from_currency": S, "to_currency": S},
       ["amount", "from_currency", "to_currency"]),
    fn("send_email", "Send an email", {"to": S, "subject": S, "body": S}, ["to", "subject"]),
    fn("search_web", "Search the web", {"query": S, "max_results": {"type": "integer"}},
       ["query"]),
    fn("get_time", "The current time in a time zone (IANA name)", {"timezone": S},
       ["timezone"]),
    fn("calculate", "Evaluate an arithmetic expression", {"expression": S}, ["expression"]),
]  # fmt: skip
PROMPTS = [
    ("What's the weather like in Paris right now?", "get_weather"),
    ("Is it raining in Tokyo? Give me fahrenheit.", "get_weather"),
    ("How cold is it in Oslo today?", "get_weather"),
    ("Tell me the temperature in Buenos Aires.", "get_weather"),
    ("Convert 250 US dollars to euros.", "convert_currency"),
    ("How many Japanese yen is 80 British pounds?", "convert_currency"),
    ("I need 1200 CHF in Canadian dollars, how much is that?", "convert_currency"),
    ("Email bob@example.com that the meeting moved to 3pm.", "send_email"),
    ("Send an email to alice@corp.io with subject 'Invoice' saying it is paid.", "send_email"),
    ("Write to team@startup.dev: subject 'Launch', body 'We ship Friday'.", "send_email"),
    ("Search the web for the latest Rust release notes.", "search_web"),
    ("Find me 3 articles about CPU inference of language models.", "search_web"),
    ("Look up who won the 2022 World Cup.", "search_web"),
    ("What time is it in New York?", "get_time"),
    ("Current time in Asia/Kolkata please.", "get_time"),
    ("Is it morning in Sydney right now? Check the time.", "get_time"),
    ("What is 1234 * 5678?", "calculate"),
    ("Compute (17 + 25) / 6 for me.", "calculate"),
    ("What's the square root of 2 times 10, roughly? Use the calculator.", "calculate"),
    ("Use a tool to find 2 to the power of 20.", "calculate"),
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


def score(rows: list[dict]) -> dict:
    """Counts over the prompts' (expected, calls) rows; only an answer's first call is judged."""
    out = {"prompts": len(rows), "called": 0, "right_tool": 0, "args_valid": 0}
    for row in rows:
        if not row["calls"]:
            continue
        out["called"] += 1
        name, args = row["calls"][0]
        out["right_tool"] += name == row["expected"]
        try:
            jsonschema.validate(json.loads(args), SCHEMAS[name])
            out["args_valid"] += name == row["expected"]
        except (ValueError, KeyError, jsonschema.ValidationError):
            pass
    return out


def run_kwker() -> dict:
    from kwker.models.loader import load_decoder
    from kwker.tools import ToolCallParser, chat_prompt, tool_format

    dec = load_decoder(MODEL, precision="int4", max_cache_len=2048)
    tok = dec.tokenizer
    fmt = tool_format(tok)
    results = {}
    for constrained in (True, False):
        rows, bare, seconds, tokens, under_grammar = [], 0, 0.0, 0, 0
        for prompt, expected in PROMPTS:
            ids = chat_prompt(tok, [{"role": "user", "content": prompt}], TOOLS)
            options = {"tools": TOOLS, "tool_choice": "auto"} if constrained else {}
            parser = ToolCallParser(fmt)
            t0 = time.perf_counter()
            text = ""
            for chunk in dec.stream_generate(ids, 256, tokenizer=tok, **options):
                parser.feed(chunk.text, chunk.token)
                text += chunk.text
                tokens += 1
            parser.flush()
            # the grammar was on: its forced tokens were proposed (kwker.constrained)
            under_grammar += chunk.stats.proposed.get("grammar", 0) > 0
            seconds += time.perf_counter() - t0
            bare += bool(parser.calls) and fmt.open not in text
            calls = [(c.name, c.arguments) for c in parser.calls]
            rows.append({"expected": expected, "calls": calls})
            print(f"{'constrained' if constrained else 'parsed only'}: {expected}: {text!r}")
        results["constrained" if constrained else "unconstrained"] = {
            **score(rows), "bare_json_calls": bare, "under_grammar": under_grammar,
            "tokens": tokens,
            "tokens_per_s": round(tokens / seconds, 1),
        }  # fmt: skip
    return results


def run_llamacpp(chat_format: str | None, port: int = 8931) -> dict:
    from openai import OpenAI

    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(GGUF), "--port", str(port),
           "--n_ctx", "4096", "--n_threads", "2", "--n_threads_batch", "2"]  # fmt: skip
    if chat_format:
        cmd += ["--chat_format", chat_format]
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
        for _ in range(240):
            try:
                client.models.list()
                break
            except Exception:  # noqa: BLE001  (still loading)
                time.sleep(0.5)
        rows = []
        for prompt, expected in PROMPTS:
            reply = client.chat.completions.create(
                model="x", messages=[{"role": "user", "content": prompt}], tools=TOOLS,
                tool_choice="auto", temperature=0, max_tokens=256,
            )  # fmt: skip
            msg = reply.choices[0].message
            calls = [(c.function.name, c.function.arguments) for c in msg.tool_calls or ()]
            rows.append({"expected": expected, "calls": calls})
            print(f"llama.cpp {chat_format}: {expected}: {calls} {msg.content!r}")
        return {"llamacpp " + (chat_format or "jinja"): score(rows)}
    finally:
        server.terminate()
        server.wait()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("engine", choices=["kwker", "llamacpp"])
    p.add_argument("--chat-format", default=None)
    args = p.parse_args()
    out = run_kwker() if args.engine == "kwker" else run_llamacpp(args.chat_format)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
