"""The cost of a k-token step (a verify step: every row's logits) over a 1-token step, for a model
file at a precision: the curve that decides how far speculation pays on this machine (perf-notes
#24). With --draft, also what a draft's proposed token costs in those 1-token steps, with its full
head and with the pruned one (perf-notes #28), next to the two models' weight bytes per token.
Sizes alternate, so that a slow moment of a shared machine hits all alike; medians.

    python scripts/verify_cost.py MODEL.gguf [--precision int4] [--ks 1,2,3,4,5,6,8] [--repeats 12]
        [--draft DRAFT.gguf]
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
    args = ap.parse_args()
    ks = sorted({1, *(int(k) for k in args.ks.split(","))})
    rng = random.Random(0)
    context = [rng.randrange(1000, 20000) for _ in range(CONTEXT)]
    runner = load_files(args.model, max_cache_len=1024, precision=args.precision).runner
    slot = runner.acquire()
    runner.extend_slot(slot, 0, context, rows="none", logits=False)
    times: dict = {k: [] for k in ks}  # k -> seconds; ("draft", head) -> seconds a proposal
    timed = [(k, lambda k=k: verify(runner, slot, k)) for k in ks]
    if args.draft:
        draft = load_files(args.draft, max_cache_len=1024, precision=DRAFT).runner
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
    for k in ks:
        t = statistics.median(times[k])
        print(f"k={k}: {t * 1e3:.1f} ms, {t / one:.2f} one-token steps")
    if args.draft:
        print(f"draft at {DRAFT}: {draft.weight_bytes_per_token / 1e6:.0f} MB with its full head")
        for pruned in (False, True):
            t = statistics.median(times["draft", pruned]) / PROPOSAL
            head = f"pruned head ({DraftProposer.HEAD_SUBSET} rows)" if pruned else "full head"
            print(f"draft token, {head}: {t * 1e3:.2f} ms, {t / one:.3f} one-token steps")


def verify(runner, slot: int, k: int) -> None:
    runner.extend([Feed(slot, CONTEXT, list(range(1234, 1234 + k)), "all")], logits=False)
    runner.trim(slot, k)


def propose(draft, slot: int, pruned: bool) -> None:
    """A proposal of PROPOSAL tokens after one fed token, as a draft's usual one (no stop)."""
    draft.propose_greedy(slot, CONTEXT, [1234], PROPOSAL, pruned)
    draft.trim(slot, draft.cached_len(slot) - CONTEXT)


if __name__ == "__main__":
    main()
