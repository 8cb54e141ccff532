"""The loaders' fuzzer in CI: seeded damage to tiny GGUF, safetensors and packed-cache files
(loader_fuzz.py: header fields, counts, lengths, offsets, types, truncations), each case ending
in a BadModelFile, a clean load or a clean rebuild of the cache, in bounded time and memory.
KWKER_LOADER_FUZZ_CASES and KWKER_LOADER_FUZZ_SEED set the run; scripts/fuzz_loaders.py runs
thousands."""

import json
import os
import subprocess
import sys
from pathlib import Path

import loader_fuzz as lf
import pytest

CASES = int(os.environ.get("KWKER_LOADER_FUZZ_CASES", "400"))
SEED = int(os.environ.get("KWKER_LOADER_FUZZ_SEED", "2026"))
# A case takes milliseconds. A header that gets something sized by its lies took 23-44 s and
# 16 GB: the bounds sit far below that and far above a case's own needs.
MAX_SECONDS = 5.0
MAX_GROWTH_MB = 64
SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "fuzz_loaders.py"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return lf.make_models(tmp_path_factory.mktemp("fuzz-models"))


def test_each_damaged_file_is_refused_loaded_or_rebuilt(models, tmp_path):
    outcomes = lf.run(models, CASES, SEED, tmp_path / "scratch")
    failures = [o for o in outcomes if o.failed]
    assert not failures, "\n\n".join(f"{o.kind}: {o.case}\n{o.detail}" for o in failures[:5])
    slowest = max(outcomes, key=lambda o: o.seconds)
    assert slowest.seconds < MAX_SECONDS, slowest.case
    # the peak RSS a case adds (a peak reached earlier in the process hides what stays below it:
    # the script's run, below, is a fresh process under an address-space cap)
    hungriest = max(outcomes, key=lambda o: o.rss_growth_kb)
    assert hungriest.rss_growth_kb < MAX_GROWTH_MB << 10, hungriest.case
    assert not [o.case for o in outcomes if o.import_accepts_refused]
    # the damage is of every degree: most of it refused, some harmless, cache entries rebuilt
    counts = lf.counts(outcomes)
    assert counts["refused"] > CASES // 2, counts
    assert counts["loaded"] > CASES // 50 and counts["rebuilt"] > CASES // 50, counts


def test_a_case_reruns_alone_as_it_ran(models, tmp_path):
    """A failure names its seed and index: rerun alone, the case damages the same bytes."""
    first = [lf.run_case(models, SEED, i, tmp_path / "a") for i in range(20)]
    again = [lf.run_case(models, SEED, i, tmp_path / "b") for i in range(20)]
    assert [(o.kind, o.case) for o in first] == [(o.kind, o.case) for o in again]


def test_the_script_runs_in_a_capped_address_space(tmp_path):
    results = tmp_path / "results.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--cases", "200", "--seed", str(SEED + 1),
         "--max-memory-mb", "1024", "--json", str(results)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-5000:]
    out = json.loads(results.read_text())
    assert out["failures"] == [] and sum(out["counts"].values()) == 200
    assert out["address_space_cap_mb"] is not None and out["peak_rss_mb"] < 512, out
    assert out["slowest"]["seconds"] < MAX_SECONDS, out["slowest"]
    assert "peak RSS" in done.stdout
