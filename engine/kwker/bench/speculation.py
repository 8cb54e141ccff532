"""`kwker bench --lookup` / `--draft`: greedy tokens/s per task of plain decoding, prompt lookup and
a draft model, checked to give the same tokens; transformers' and llama.cpp's own prompt lookup as
peers."""

from __future__ import annotations

import statistics
import time

import numpy as np
import torch

from kwker.bench import report
from kwker.bench.peers import llama_lookup_peer
from kwker.precision import DRAFT

TASKS = {
    "rewrite": "Fix the typos in this paragraph and return the whole corrected paragraph:\n\n"
    "The quick brwon fox jumpd over the lazy dog. It was a sunny day and the fox was verry happy. "
    "After jumping, the fox ran into the forrest, where it met a freindly owl. The owl asked the fox "
    "where it was going, and the fox said it was looking for its familly. Together they walked "
    "thru the trees untill the sun went down.",
    # an edit that keeps most of a longer text: what lookup after a long match is for
    "edit": "Rename the function load_config to read_config everywhere in this module and return the "
    "whole module, otherwise unchanged:\n\n"
    'import json\nimport os\n\nDEFAULTS = {"threads": 4, "precision": "int4", "cache": 1024}\n\n\n'
    'def load_config(path):\n    """Reads the JSON settings at path over the defaults."""\n'
    "    settings = dict(DEFAULTS)\n    if os.path.exists(path):\n        with open(path) as f:\n"
    "            settings.update(json.load(f))\n    return settings\n\n\n"
    'def save_config(path, settings):\n    """Writes the settings that differ from the defaults."""\n'
    "    changed = {k: v for k, v in settings.items() if DEFAULTS.get(k) != v}\n"
    '    with open(path, "w") as f:\n        json.dump(changed, f, indent=2)\n\n\n'
    'def threads(path):\n    return load_config(path)["threads"]\n\n\n'
    'def precision(path):\n    return load_config(path)["precision"]\n',
    "chat": "Tell me a short story about a dragon who learns to cook.",
    "code": "Rewrite this function with type hints and a docstring, keeping the logic the same:\n\n"
    "def area(shape, a, b=None):\n    if shape == 'square':\n        return a * a\n"
    "    if shape == 'rectangle':\n        return a * b\n    if shape == 'circle':\n"
    "        return 3.14159 * a * a\n    raise ValueError(shape)\n",
}
LOOKUP = 8  # kwker's prompt lookup length (its default)
PEER_LOOKUP = 10  # transformers' and llama.cpp's prompt_lookup_num_tokens


def run_speculative(
    model_spec=None,
    precision=None,
    threads=None,
    draft_spec=None,
    max_new_tokens=160,
    repeats=3,
    out=print,
    draft_precision=None,
) -> dict:
    """Greedy tokens/s per task: plain decoding, prompt lookup (and the draft model, with
    draft_spec), checked to give the same tokens; plus transformers' own prompt_lookup_num_tokens on
    the same task as a peer."""
    from kwker.loading.build import default_threads
    from kwker.loading.load import load_files
    from kwker.models.loader import DEFAULT_MODEL, load_model, resolve_model

    threads = threads or default_threads()
    # kwker loads the files as the app does (a GGUF's K-quant blocks kept); the peers' transformers
    # model is loaded only for the peers
    dec = load_files(
        resolve_model(model_spec), max_cache_len=1024, precision=precision, threads=threads
    )
    tokenizer = dec.tokenizer
    modes = {"plain": dict(lookup=0), "lookup": dict(lookup=LOOKUP)}
    if draft_spec:
        draft = load_files(
            resolve_model(draft_spec),
            max_cache_len=1024,
            precision=draft_precision or DRAFT,
            threads=threads,
            fewest_bytes=True,
        )
        modes["draft"] = dict(lookup=0, draft=draft)
        modes["lookup+draft"] = dict(lookup=LOOKUP, draft=draft)
    result = {
        "model": model_spec or DEFAULT_MODEL,
        "precision": dec.precision,
        "threads": threads,
        "tasks": {},
    }
    # transformers' float32 forward of a large target is too slow to be a useful peer beside a draft
    peers = not draft_spec
    if peers:
        torch.set_num_threads(threads)
        model, _ = load_model(model_spec, dtype=torch.float32)
    # llama.cpp in the format of the precision kwker runs at (None: the files' nearest)
    llama = llama_lookup_peer(model_spec, dec.precision, threads, out) if peers else None
    if draft_spec:
        out(f"draft {draft_spec} at {draft.precision}")
        result["draft"] = {"model": draft_spec, "precision": draft.precision}
    for line in report.SPECULATIVE_HEADER:
        out(line)
    for task, text in TASKS.items():
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True
        )["input_ids"]
        result["tasks"][task] = time_modes(dec, ids, modes, max_new_tokens, repeats, task, out)
        if not peers:
            continue
        ratio = transformers_lookup_speedup(model, tokenizer, torch.tensor([ids]), max_new_tokens)
        out(f"| {task} | transformers prompt lookup | {ratio:.2f}x its own plain decoding |")
        result["tasks"][task]["transformers_lookup_speedup"] = ratio
        if llama is not None:
            ratio, same = llama.lookup_speedup(ids, max_new_tokens, repeats)
            out(
                f"| {task} | llama.cpp prompt lookup ({llama.fmt}) | {ratio:.2f}x its own plain decoding"
                f"{'' if same else ', and a different text than its plain decoding'} |"
            )
            result["tasks"][task]["llama_cpp_lookup"] = {
                "speedup": ratio,
                "same_text_as_plain": same,
            }
    return result


def time_modes(dec, ids, modes: dict, max_new_tokens: int, repeats: int, task: str, out) -> dict:
    """Median tokens/s of each mode on one prompt (modes alternate, so that machine drifts hit all
    alike), after checking that every mode gave plain decoding's tokens."""
    rates, outputs, stats = {m: [] for m in modes}, {}, {}
    inside: dict[str, list[float]] = {m: [] for m in modes}  # each run's in-answer speedup
    # the draft's seconds per proposed token, each run's over that run's plain steps
    draft_costs: dict[str, list[float]] = {m: [] for m in modes}
    plain_steps: list[float] = []
    for _ in range(repeats):
        for mode, kw in modes.items():
            dec.reset()
            outputs[mode] = dec.generate(ids, max_new_tokens=max_new_tokens, **kw)
            stats[mode] = s = dec.last_stats
            rates[mode].append(s.tokens_per_s)
            if s.speedup is not None:
                inside[mode].append(s.speedup)
            if mode == "plain":
                plain_steps.append(s.plain_step_s)
            if s.proposed.get("draft"):
                draft_costs[mode].append(s.draft_s / s.proposed["draft"])
    for mode in modes:
        if not np.array_equal(np.asarray(outputs[mode]), np.asarray(outputs["plain"])):
            raise AssertionError(f"{mode} changed the output of task {task}")
    base = statistics.median(rates["plain"])
    step = statistics.median(plain_steps)
    rows = {}
    for mode in modes:
        median = statistics.median(rates[mode])
        cost = statistics.median(draft_costs[mode]) / step if draft_costs[mode] else None
        in_answer = statistics.median(inside[mode]) if inside[mode] else None
        out(report.speculative_row(task, mode, median, base, stats[mode], cost, in_answer))
        rows[mode] = {
            "tokens_per_s": median,
            "speedup": median / base,
            "in_answer_speedup": in_answer,
            "tokens_per_step": stats[mode].tokens_per_step,
            "draft_token_cost": cost,
        }
    return rows


def transformers_lookup_speedup(model, tokenizer, ids, max_new_tokens: int) -> float:
    """How much faster transformers' generate is with its own prompt lookup than without, on the
    same weights (one run each)."""
    seconds = []
    for n in (0, PEER_LOOKUP):
        kw = dict(prompt_lookup_num_tokens=n) if n else {}
        t0 = time.perf_counter()
        model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=tokenizer.eos_token_id,
            **kw,
        )
        seconds.append(time.perf_counter() - t0)
    return seconds[0] / seconds[1]
