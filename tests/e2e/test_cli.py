"""The command line as a user runs it: `kwker generate` on the default model and
`kwker bench --json`."""

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def kwker(*args, timeout=600):
    return subprocess.run(
        [sys.executable, "-m", "kwker.cli", *args], capture_output=True, text=True, timeout=timeout
    )


SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_the_readmes_example_answers_right_on_the_default_model():
    """README: `kwker generate "What is the capital of France?"`, the default model at its default
    precision (int4), greedy and with seeds."""
    q = "What is the capital of France?"
    r = kwker("generate", q, "--max-new-tokens", "32")
    assert r.returncode == 0, r.stderr
    assert "Paris" in r.stdout and "int4" in r.stderr and "tokens/s" in r.stderr
    for seed in ("1", "2"):
        r = kwker("generate", q, "--max-new-tokens", "32", "--seed", seed)
        assert r.returncode == 0 and "Paris" in r.stdout, (r.stdout, r.stderr)


def test_generate_with_a_seed_is_reproducible(smollm2):
    story = ("generate", SMOLLM2, "Tell me a story.", "--max-new-tokens", "16", "--seed", "3")
    a, b = kwker(*story), kwker(*story)
    assert a.returncode == 0 and a.stdout == b.stdout and len(a.stdout.split()) > 3


def test_generate_refuses_a_missing_model_clearly(tmp_path):
    r = kwker("generate", str(tmp_path / "nope.gguf"), "hi")
    assert r.returncode == 2
    assert "no such GGUF file" in r.stderr


def test_bench_reports_kwker_and_transformers(smollm2, tmp_path):
    out = tmp_path / "bench.json"
    r = kwker(
        "bench",
        SMOLLM2,
        "--pp",
        "32",
        "--tg",
        "8",
        "--depth",
        "40",
        "--repeats",
        "2",
        "--precision",
        "fp32",  # transformers' peer is float (the file's own precision, int4, has none)
        "--vs",
        "transformers",
        "--json",
        str(out),
    )
    assert r.returncode == 0, r.stderr
    report = json.loads(out.read_text())
    tests = {(x["engine"], x["test"]) for x in report["results"]}
    assert tests == {
        ("kwker", "pp32"),
        ("kwker", "tg8@d40"),
        ("transformers", "pp32"),
        ("transformers", "tg8@d40"),
    }
    assert all(
        x["tokens_per_s"]["mean"] > 0 and len(x["tokens_per_s"]["values"]) == 2
        for x in report["results"]
    )
    assert set(report["ratios"]) == {"pp32 kwker/transformers", "tg8@d40 kwker/transformers"}
    assert report["machine"]["read_gb_s_1_thread"] > 1
    threads = report["threads"]
    assert report["machine"][f"int8_gmacs_{threads}_threads"] > 1
    # prefill is reported as compute: SmolLM2-135M's layer matrices (q, o: 576x576; k, v: 192x576;
    # gate, up, down: 1536x576) times 30 layers are the multiply-accumulates of a prompt token
    macs = 30 * (2 * 576 * 576 + 2 * 192 * 576 + 3 * 1536 * 576)
    pp = next(x for x in report["results"] if (x["engine"], x["test"]) == ("kwker", "pp32"))
    assert pp["gmac_s"] == pytest.approx(pp["tokens_per_s"]["median"] * macs / 1e9)
    assert len(report["machine"]["compute_peak_gmac_s_beside_runs"]) == 2  # one probe per repeat
    assert all(p > 1 for p in report["machine"]["compute_peak_gmac_s_beside_runs"])
    # RSS of kwker alone, measured in a fresh process that freed the float model: below this run's,
    # which holds it
    rss = report["rss_mb"]
    assert 100 < rss["steady_alone"] <= rss["peak_alone"] and rss["steady_alone"] < rss["now"]
    assert "| kwker | tg8@d40 |" in r.stdout
