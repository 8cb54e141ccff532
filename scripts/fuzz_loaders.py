"""Fuzzes the model-file loaders: seeded damage to tiny GGUF, safetensors and packed-cache files
(tests/engine/loader_fuzz.py says what is damaged and how each case may end), thousands of cases.

    python scripts/fuzz_loaders.py --cases 3000 --seed 1 [--max-memory-mb 2048] [--json out.json]

Prints the count of each ending, the slowest case and the peak RSS, and every failure with its
case and traceback (rerun one alone with --seed S --first I --cases 1). The address space is
capped (RLIMIT_AS) at --max-memory-mb over what the process maps once warm, so that a header
which gets memory sized by its lies fails its case with a MemoryError, instead of swapping the
machine. Exits 1 when any case failed. tests/engine/test_loader_fuzz.py runs this in CI.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "engine")]  # the fuzzer's helpers

import loader_fuzz as lf  # noqa: E402


def mapped_mb() -> float:
    """The address space this process maps now (VmSize), in MB."""
    with open("/proc/self/status") as f:
        sizes = dict(line.split(":", 1) for line in f)
    return int(sizes["VmSize"].split()[0]) / 1024


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--first", type=int, default=0, help="the index of the first case")
    parser.add_argument("--max-memory-mb", type=int, default=2048,
                        help="address space allowed over the warm process's (0: none)")  # fmt: skip
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="kwker-fuzz-") as tmp:
        models = lf.make_models(Path(tmp) / "models")
        # warm: one case of each kind, so that what the loads import and map once (transformers'
        # tokenizer converter, the native thread pool) is counted before the cap
        lf.run(models, 20, args.seed + 1, Path(tmp) / "warm")
        cap = None
        if args.max_memory_mb:
            cap = mapped_mb() + args.max_memory_mb
            hard = resource.getrlimit(resource.RLIMIT_AS)[1]
            resource.setrlimit(resource.RLIMIT_AS, (int(cap) << 20, hard))
        started = time.perf_counter()
        outcomes = []
        for index in range(args.first, args.first + args.cases):
            outcomes.append(lf.run_case(models, args.seed, index, Path(tmp) / "scratch"))
            if (index - args.first) % 500 == 499:
                print(f"  {index - args.first + 1} cases, {lf.counts(outcomes)}", file=sys.stderr)
        seconds = time.perf_counter() - started

    failures = [o for o in outcomes if o.failed]
    slowest = max(outcomes, key=lambda o: o.seconds)
    hungriest = max(outcomes, key=lambda o: o.rss_growth_kb)
    peak_mb = lf.peak_rss_kb() / 1024
    results = {
        "cases": args.cases,
        "seed": args.seed,
        "first": args.first,
        "seconds": round(seconds, 1),
        "counts": lf.counts(outcomes),
        "peak_rss_mb": round(peak_mb),
        "address_space_cap_mb": round(cap) if cap else None,
        "slowest": {"index": args.first + outcomes.index(slowest), "case": slowest.case,
                    "seconds": round(slowest.seconds, 3)},
        "largest_rss_growth": {"index": args.first + outcomes.index(hungriest),
                               "case": hungriest.case,
                               "mb": round(hungriest.rss_growth_kb / 1024, 1)},
        "import_accepts_refused": [o.case for o in outcomes if o.import_accepts_refused],
        "failures": [{"index": args.first + outcomes.index(o), "kind": o.kind, "case": o.case,
                      "detail": o.detail} for o in failures],
    }  # fmt: skip
    print(f"{args.cases} cases (seed {args.seed}) in {seconds:.1f} s: {results['counts']}")
    print(f"slowest: {slowest.seconds * 1000:.0f} ms, {slowest.case}")
    print(f"largest peak-RSS growth of a case: {hungriest.rss_growth_kb / 1024:.1f} MB, "
          f"{hungriest.case}")  # fmt: skip
    cap_text = f", address space capped at {cap:.0f} MB" if cap else ""
    print(f"peak RSS: {peak_mb:.0f} MB{cap_text}")
    for case in results["import_accepts_refused"]:
        print(f"import accepts what the load refuses: {case}")
    for f in results["failures"]:
        print(f"\nFAILED case {f['index']}: {f['kind']}: {f['case']}\n{f['detail']}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
