"""A/B in one process: the draft's widths chosen at a hopeful bound of its acceptance (after: Speculator.HOPE
as in the code) and at the estimate (before: HOPE = 0), against plain decoding, on the bench's prompts.
Modes alternate; medians of the repeats. `fresh`: each generation starts from no measured costs, as the first
text of a fresh process does (`warm`: the costs carry over, as in the app). Every mode must give plain's text.

    python scripts/ab_draft_hope.py int4 3 rewrite,code,chat,edit fresh

Uses Qwen2.5-Coder-1.5B-Instruct and its 0.5B as the draft, from kwker's model folder (`kwker models list`)."""

import glob
import os
import statistics
import sys

from kwker.bench.speculation import TASKS
from kwker.loading.load import load_decoder
from kwker.precision import DRAFT
from kwker.speculative import Speculator, StepCosts

MODES = ("plain", "before", "after")


def model_file(size: str) -> str:
    folder = f"~/.cache/kwker/models/Qwen--Qwen2.5-Coder-{size}-Instruct/*.gguf"
    return glob.glob(os.path.expanduser(folder))[0]


def main(precision: str, repeats: int, tasks: list[str], fresh: bool) -> None:
    target = load_decoder(model_file("1.5B"), max_cache_len=1024, precision=precision)
    draft = load_decoder(model_file("0.5B"), max_cache_len=1024, precision=DRAFT)
    hope = Speculator.HOPE
    for task in tasks:
        chat = [{"role": "user", "content": TASKS[task]}]
        ids = target.tokenizer.apply_chat_template(
            chat, add_generation_prompt=True, return_tensors="pt", return_dict=True
        )["input_ids"]
        runs: dict[str, list[tuple]] = {mode: [] for mode in MODES}
        texts = {}
        for _ in range(repeats):
            for mode in MODES:
                Speculator.HOPE = hope if mode == "after" else 0.0
                target.reset()
                if fresh:
                    target._solo_costs = StepCosts()
                kw = dict(lookup=0) if mode == "plain" else dict(lookup=0, draft=draft)
                texts[mode] = target.generate(ids, max_new_tokens=160, **kw)[0].tolist()
                s = target.last_stats
                runs[mode].append(
                    (s.tokens_per_s, s.tokens_per_step, s.speedup or 1.0,
                     s.accepted.get("draft", 0), s.proposed.get("draft", 0))
                )  # fmt: skip
        assert texts["before"] == texts["plain"] == texts["after"]
        base = statistics.median(r[0] for r in runs["plain"])
        for mode, rows in runs.items():
            rate, per_step, inside = (statistics.median(r[i] for r in rows) for i in range(3))
            kept, proposed = sum(r[3] for r in rows), sum(r[4] for r in rows)
            print(
                f"{precision} {task} {mode}: {rate / base:.2f}x, in-answer {inside:.2f}x, "
                f"{per_step:.2f} tokens a step, kept {kept}/{proposed}; "
                f"tokens/s {[round(r[0], 1) for r in rows]}",
                flush=True,
            )


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3].split(","), sys.argv[4] == "fresh")
