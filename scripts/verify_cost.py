"""The cost of a k-token step (a verify step: every row's logits) over a 1-token step, for a model
file at a precision: the curve that decides how far speculation pays on this machine (perf-notes
#24). With --draft, also what a draft's proposed token costs in those 1-token steps, with its full
head and with the pruned one (perf-notes #28), next to the two models' weight bytes per token.
With --batch, a step of k sequences' one token each (the serving engine's batch step, only the
last row's logits), not k tokens of one sequence. Sizes alternate, so that a slow moment of a
shared machine hits all alike; each k's figure is the median of its rounds' ratios to the 1-token
step of the same round.

    python scripts/verify_cost.py MODEL.gguf [--precision int4] [--ks 1,2,3,4,5,6,8] [--repeats 12]
        [--draft DRAFT.gguf | --batch]
"""

import argparse
import random
import statistics
import time

import numpy as np

from kwker.loading.load import load_files
from kwker.precision import DRAFT
from kwker.runner import Feed
from kwker.speculative import DraftProposer

CONTEXT = 300  # tokens already in the cache, as after a short prompt and answer
PROPOSAL = 4  # tokens of the timed draft proposals


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--precision", default="int4")
    ap.add_argument("--ks", default="1,2,3,4,5,6,8")
    ap.add_argument("--repeats", type=int, default=12)
    ap.add_argument("--draft", help="a draft model's file (run at kwker.precision.DRAFT)")
    ap.add_argument("--batch", action="store_true", help="k sequences of one token, not k tokens")
    args = ap.parse_args()
    if args.batch and args.draft:
        ap.error("--batch times the model's own steps; it takes no --draft")
    ks = sorted({1, *(int(k) for k in args.ks.split(","))})
    rng = random.Random(0)
    context = [rng.randrange(1000, 20000) for _ in range(CONTEXT)]
    width = max(ks) if args.batch else 1
    runner = load_files(
        args.model, max_cache_len=1024, precision=args.precision, max_batch=width
    ).runner
    slots = [runner.acquire() for _ in range(width)]
    for slot in slots:
        runner.extend_slot(slot, 0, context, rows="none", logits=False)
    times: dict = {k: [] for k in ks}  # k -> seconds; ("draft", head) -> seconds a proposal
    if args.batch:
        timed = [(k, lambda k=k: batch(runner, slots[:k])) for k in ks]
    else:
        timed = [(k, lambda k=k: verify(runner, slots[0], k)) for k in ks]
    if args.draft:
        # as the app and `kwker bench --draft` load a draft: no matrix wider than int4
        draft = load_files(
            args.draft, max_cache_len=1024, precision=DRAFT, fewest_bytes=True
        ).runner
        dslot = draft.acquire()
        draft.extend_slot(dslot, 0, context, rows="none", logits=False)
        draft.set_head_subset(np.arange(DraftProposer.HEAD_SUBSET))
        for pruned in (False, True):
            times["draft", pruned] = []
            timed.append((("draft", pruned), lambda p=pruned: propose(draft, dslot, p)))
    for _ in range(args.repeats):
        for key, run in timed:
            t0 = time.perf_counter()
            run()
            times[key].append(time.perf_counter() - t0)
    one = statistics.median(times[1])
    print(
        f"{args.precision} on {runner.isa}, {runner.threads} threads: 1-token step {one * 1e3:.1f} ms, "
        f"{runner.weight_bytes_per_token / 1e6:.0f} MB of weights"
    )
    what = "sequences" if args.batch else "tokens"
    for k in ks:
        ratios = [t / t1 for t, t1 in zip(times[k], times[1], strict=True)]
        print(
            f"k={k} {what}: {statistics.median(times[k]) * 1e3:.1f} ms, "
            f"{statistics.median(ratios):.2f} one-token steps"
        )
    if args.draft:
        print(f"draft at {DRAFT}: {draft.weight_bytes_per_token / 1e6:.0f} MB with its full head")
        for pruned in (False, True):
            t = statistics.median(times["draft", pruned]) / PROPOSAL
            head = f"pruned head ({DraftProposer.HEAD_SUBSET} rows)" if pruned else "full head"
            print(f"draft token, {head}: {t * 1e3:.2f} ms, {t / one:.3f} one-token steps")


def verify(runner, slot: int, k: int) -> None:
    runner.extend([Feed(slot, CONTEXT, list(range(1234, 1234 + k)), "all")], logits=False)
    runner.trim(slot, k)


def batch(runner, slots: list[int]) -> None:
    """One step of one token for each slot, as the serving engine's batch of len(slots)."""
    runner.extend([Feed(slot, CONTEXT, [1234], "last") for slot in slots], logits=False)
    for slot in slots:
        runner.trim(slot, 1)


def propose(draft, slot: int, pruned: bool) -> None:
    """A proposal of PROPOSAL tokens after one fed token, as a draft's usual one (no stop)."""
    draft.propose_greedy(slot, CONTEXT, [1234], PROPOSAL, pruned)
    draft.trim(slot, draft.cached_len(slot) - CONTEXT)


if __name__ == "__main__":
    main()
