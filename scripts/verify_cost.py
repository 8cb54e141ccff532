"""The cost of a k-token step (a verify step: every row's logits) over a 1-token step, for a model
file at a precision: the curve that decides how far speculation pays on this machine (perf-notes
#24). Sizes alternate, so that a slow moment of a shared machine hits all alike; medians.

    python scripts/verify_cost.py MODEL.gguf [--precision int4] [--ks 1,2,3,4,5,6,8] [--repeats 12]
"""

import argparse
import random
import statistics
import time

from kwker.loading.load import load_decoder
from kwker.runner import Feed

CONTEXT = 300  # tokens already in the cache, as after a short prompt and answer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--precision", default="int4")
    ap.add_argument("--ks", default="1,2,3,4,5,6,8")
    ap.add_argument("--repeats", type=int, default=12)
    args = ap.parse_args()
    ks = sorted({1, *(int(k) for k in args.ks.split(","))})
    dec = load_decoder(args.model, max_cache_len=1024, precision=args.precision)
    runner = dec.runner
    slot = runner.acquire()
    rng = random.Random(0)
    context = [rng.randrange(1000, 20000) for _ in range(CONTEXT)]
    runner.extend_slot(slot, 0, context, rows="none", logits=False)
    times: dict[int, list[float]] = {k: [] for k in ks}
    for _ in range(args.repeats):
        for k in ks:
            t0 = time.perf_counter()
            runner.extend([Feed(slot, CONTEXT, list(range(1234, 1234 + k)), "all")], logits=False)
            times[k].append(time.perf_counter() - t0)
            runner.trim(slot, k)
    one = statistics.median(times[1])
    print(
        f"{args.precision} on {runner.isa}, {runner.threads} threads: 1-token step {one * 1e3:.1f} ms"
    )
    for k in ks:
        t = statistics.median(times[k])
        print(f"k={k}: {t * 1e3:.1f} ms, {t / one:.2f} one-token steps")


if __name__ == "__main__":
    main()
