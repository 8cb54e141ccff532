"""A/B of a speculation change in one process, against plain decoding, on the bench's prompts
(Qwen2.5-Coder-1.5B as the target, its 0.5B as the draft, from kwker's model folder:
`kwker models list`). Modes alternate, so that the shared machine's drifts hit all alike; medians
of the repeats. Every mode must give plain's text.

    python scripts/ab_speculation.py CHANGE PRECISION REPEATS TASKS

CHANGE (before -> after, as the code is now):
- hope: the draft's widths chosen at its estimated acceptance -> at a hopeful bound
  (Speculator.HOPE; perf-notes #30). Lookup off; each generation starts from no measured costs, as
  the first text of a fresh process does.
- lookup-copy: prompt lookup that follows the longest match -> that also follows the copy under way
  and resumes it after an edit (LookupProposer.copy; perf-notes #32). Lookup alone; the costs carry
  over as in the app.

    python scripts/ab_speculation.py hope int4 3 rewrite,code,chat,edit
    python scripts/ab_speculation.py lookup-copy int4 4 edit,rewrite,code,chat
"""

import glob
import os
import statistics
import subprocess
import sys
import types

from kwker import generation
from kwker.bench.speculation import TASKS
from kwker.loading.load import load_files
from kwker.precision import DRAFT
from kwker.speculative import Speculator, StepCosts


def model_file(size: str) -> str:
    folder = f"~/.cache/kwker/models/Qwen--Qwen2.5-Coder-{size}-Instruct/*.gguf"
    return glob.glob(os.path.expanduser(folder))[0]


class Hope:
    def __init__(self, target, draft):
        self.kw, self.target, self.hope = dict(lookup=0, draft=draft), target, Speculator.HOPE

    def set_up(self, after: bool) -> None:
        Speculator.HOPE = self.hope if after else 0.0
        self.target._solo_costs = StepCosts()

    def done(self, after: bool) -> None:
        pass


class LookupCopy:
    """Lookup alone, its proposer as at commit BEFORE (longest match, latest occurrence on a tie) ->
    as now (it also follows the copy under way and resumes it after an edit)."""

    BEFORE = "48dcc05"

    def __init__(self, target, draft):
        source = subprocess.run(
            ["git", "show", f"{self.BEFORE}:engine/kwker/speculative.py"],
            capture_output=True, text=True, check=True, cwd=os.path.dirname(__file__),
        ).stdout  # fmt: skip
        # the suffix automata's home since kwker.suffix was deprecated
        source = source.replace("from kwker.suffix import", "from kwker.speculative import")
        old = sys.modules["speculative_before"] = types.ModuleType("speculative_before")
        exec(compile(source, "speculative_before", "exec"), old.__dict__)
        self.proposers = {False: old.LookupProposer, True: generation.LookupProposer}
        self.kw = dict(lookup=8)

    def set_up(self, after: bool) -> None:
        generation.LookupProposer = self.proposers[after]

    def done(self, after: bool) -> None:
        generation.LookupProposer = self.proposers[True]


CHANGES = {"hope": Hope, "lookup-copy": LookupCopy}


def main(change: str, precision: str, repeats: int, tasks: list[str]) -> None:
    target = load_files(model_file("1.5B"), max_cache_len=1024, precision=precision)
    draft = load_files(model_file("0.5B"), max_cache_len=1024, precision=DRAFT)
    ab = CHANGES[change](target, draft)
    for task in tasks:
        chat = [{"role": "user", "content": TASKS[task]}]
        ids = target.tokenizer.apply_chat_template(
            chat, add_generation_prompt=True, return_tensors="pt", return_dict=True
        )["input_ids"]
        runs: dict[str, list[tuple]] = {mode: [] for mode in ("plain", "before", "after")}
        texts = {}
        for _ in range(repeats):
            for mode in runs:
                after = mode == "after"
                ab.set_up(after)
                target.reset()
                kw = dict(lookup=0) if mode == "plain" else ab.kw
                texts[mode] = target.generate(ids, max_new_tokens=160, **kw)[0].tolist()
                ab.done(after)
                s = target.last_stats
                kept, proposed = sum(s.accepted.values()), sum(s.proposed.values())
                runs[mode].append(
                    (s.tokens_per_s, s.tokens_per_step, s.speedup or 1.0, kept, proposed)
                )
        assert texts["before"] == texts["plain"] == texts["after"]
        base = statistics.median(r[0] for r in runs["plain"])
        for mode, rows in runs.items():
            rate, per_step, inside = (statistics.median(r[i] for r in rows) for i in range(3))
            kept, proposed = sum(r[3] for r in rows), sum(r[4] for r in rows)
            print(
                f"{change} {precision} {task} {mode}: {rate / base:.2f}x, in-answer {inside:.2f}x, "
                f"{per_step:.2f} tokens a step, kept {kept}/{proposed}; "
                f"tokens/s {[round(r[0], 1) for r in rows]}",
                flush=True,
            )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4].split(","))
