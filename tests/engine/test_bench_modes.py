"""`kwker bench --batch` and `--lookup` / `--draft` run kwker on the model's files, as the app and
`kwker serve` do: their rows come from the decoder the files give (a GGUF's K-quant blocks kept),
and speculation's modes give plain decoding's tokens."""

from kwker.bench.batch import run_batch
from kwker.bench.speculation import TASKS, run_speculative

SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_batch_bench_serves_requests_on_the_files():
    lines = []
    result = run_batch(
        SMOLLM2,
        precision="int4",
        batches=(1, 3),
        tg=6,
        prompt_len=10,
        repeats=3,
        out=lines.append,
    )
    assert result["precision"] == "int4"
    rows = result["results"]
    assert [r["batch"] for r in rows] == [1, 3]
    for r in rows:
        # b requests of 6 tokens each, every one read to its end: positive, finite rates, a row
        # the median of its 3 rounds
        assert len(r["runs"]) == 3
        for key in ("tokens_per_s", "generation_tokens_per_s", "ttft_ms"):
            values = sorted(run[key] for run in r["runs"])
            assert 0 < values[0] and values[-1] < 1e6 and r[key] == values[1]
    # the ratio is the median of the rounds' own ratios, batch 1's exactly 1
    assert rows[0]["generation_tokens_per_s_ratio"] == 1.0
    ratios = sorted(
        b["generation_tokens_per_s"] / a["generation_tokens_per_s"]
        for a, b in zip(rows[0]["runs"], rows[1]["runs"], strict=True)
    )
    assert rows[1]["generation_tokens_per_s_ratio"] == ratios[1]
    assert f"batch 3: generation {ratios[1]:.2f}x" in "\n".join(lines)


def test_speculation_bench_modes_on_the_files():
    lines = []
    # SmolLM2 as its own draft (no peers are run beside a draft): every mode runs, and
    # run_speculative raises if one changes a token (the controller may not draft at all, as a
    # draft this dear never pays)
    result = run_speculative(
        SMOLLM2,
        precision="int4",
        draft_spec=SMOLLM2,
        max_new_tokens=24,
        repeats=1,
        out=lines.append,
    )
    assert result["precision"] == "int4" and result["draft"]["precision"] == "int4"
    assert set(result["tasks"]) == set(TASKS)
    for rows in result["tasks"].values():
        assert set(rows) == {"plain", "lookup", "draft", "lookup+draft"}
        assert rows["plain"]["speedup"] == 1.0
        for row in rows.values():
            assert row["tokens_per_s"] > 0 and row["tokens_per_step"] >= 1
    # the rewrite task copies its prompt: lookup takes several tokens a step there
    assert result["tasks"]["rewrite"]["lookup"]["tokens_per_step"] > 1
