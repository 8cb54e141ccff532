"""How `kwker bench` shows its results: the lines and markdown tables it prints, and its JSON
report."""

from __future__ import annotations

import json
from pathlib import Path

from kwker.bench.measure import Result


def machine_line(limits: dict, threads: int) -> str:
    return (
        f"machine: {limits['isa']}, read {limits['read_gb_s_1_thread']:.1f} GB/s (1 thread), "
        f"{limits[f'read_gb_s_{threads}_threads']:.1f} GB/s ({threads} threads), fp32 FMA peak "
        f"{limits[f'fma_gflops_{threads}_threads']:.0f} GFLOP/s, int8 peak "
        f"{limits[f'int8_gmacs_{threads}_threads']:.0f} GMAC/s"
    )


def model_line(name: str, precision: str | None, threads: int, bytes_per_token: int) -> str:
    return (
        f"model: {name}, precision {precision or 'model dtype'}, threads {threads}, kwker reads "
        f"{bytes_per_token / 1e6:.0f} MB of weights per token"
    )


def bandwidth_line(probes: list[float], median: float, threads: int) -> str:
    return (
        f"read bandwidth beside the generation runs: median {median:.1f} GB/s ({threads} threads; range "
        f"{min(probes):.1f}-{max(probes):.1f}): the roofline below"
    )


def peak_line(peaks: list[float], median: float, kind: str, threads: int) -> str:
    return (
        f"{kind} compute peak beside the prefill runs: median {median:.0f} GMAC/s ({threads} threads; "
        f"range {min(peaks):.0f}-{max(peaks):.0f})"
    )


RESULTS_HEADER = [
    "| engine | test | tokens/s mean ± sd | median | GB/s | of roofline |",
    "|---|---|---|---|---|---|",
]


def result_row(r: Result, macs: int, bandwidth: float, peak: float, kind: str) -> tuple[str, dict]:
    """(table line, JSON row) of one result. Generation is held to the read bandwidth (it streams
    every weight once per token), prefill to the compute peak of `kind` (int8 or fp32) kernels."""
    speed = {"mean": r.mean, "sd": r.sd, "median": r.median, "values": r.values}
    if r.test.startswith("tg"):
        gbs = r.median * r.bytes_per_token / 1e9
        rate, roof, gmacs = f"{gbs:.1f}", f"{gbs / bandwidth:.0%}", None
    else:
        gbs, gmacs = None, r.median * macs / 1e9
        rate = f"{gmacs:.0f} GMAC/s"
        roof = f"{gmacs / peak:.0%} of {kind} peak" if peak else ""
    line = (
        f"| {r.engine} | {r.test} | {r.mean:.1f} ± {r.sd:.1f} | {r.median:.1f} | {rate} | {roof} |"
    )
    return line, {
        "engine": r.engine,
        "test": r.test,
        "tokens_per_s": speed,
        "gb_s": gbs,
        "gmac_s": gmacs,
    }


def ratio_lines(ratios: dict) -> list[str]:
    return [f"{k}: {v:.2f}x (medians)" for k, v in ratios.items()]


def memory_lines(report: dict, alone: dict) -> list[str]:
    rss = report["rss_mb"]
    return [
        f"kwker generation roofline here: {report['roofline_tg_tokens_per_s']:.1f} tokens/s; this run's RSS "
        f"peak {rss['peak']:.0f} MB, now {rss['now']:.0f} MB (float model and peers loaded)",
        f"kwker alone (a fresh process: load, pack, float model freed, 32 tokens generated, max_cache_len "
        f"{alone['max_cache_len']}): steady RSS {alone['steady']:.0f} MB, peak {alone['peak']:.0f} MB",
    ]


BATCH_HEADER = [
    "| batch | aggregate tokens/s (whole run) | aggregate generation tokens/s | per sequence | "
    "mean time to first token |",
    "|---|---|---|---|---|",
]


def batch_row(r: dict) -> str:
    gen = r["generation_tokens_per_s"]
    return (
        f"| {r['batch']} | {r['tokens_per_s']:.1f} | {gen:.1f} | {gen / r['batch']:.1f} | "
        f"{r['ttft_ms']:.0f} ms |"
    )


def batch_scaling_lines(rows: list[dict], repeats: int = 1) -> list[str]:
    """Each batch's ratio to the first: the median of the rounds' ratios."""
    first = rows[0]["batch"]
    of = f" (medians of {repeats} rounds' ratios)" if repeats > 1 else ""
    return [
        f"batch {r['batch']}: generation {r['generation_tokens_per_s_ratio']:.2f}x, whole run "
        f"{r['tokens_per_s_ratio']:.2f}x batch {first}{of}"
        for r in rows
    ]


# "in-answer": GenerationStats.speedup, each run's steps against its own plain steps (median of the
# runs); on a shared machine it is steadier than the ratio of two runs' tokens/s, which were taken
# at different moments
SPECULATIVE_HEADER = [
    "| task | mode | tokens/s median | speedup | in-answer speedup | tokens per step | accepted "
    "| draft token cost |",
    "|---|---|---|---|---|---|---|---|",
]


def speculative_row(
    task: str,
    mode: str,
    median: float,
    base: float,
    stats,
    draft_cost: float | None = None,
    in_answer: float | None = None,
) -> str:
    """draft_cost: the draft's time per proposed token over a plain target step (median runs);
    in_answer: the median of the runs' GenerationStats.speedup."""
    accepted = {k: f"{v}/{stats.proposed[k]}" for k, v in stats.accepted.items()}
    cost = "-" if draft_cost is None else f"{draft_cost:.3f}"
    inside = "-" if in_answer is None else f"{in_answer:.2f}x"
    return (
        f"| {task} | {mode} | {median:.1f} | {median / base:.2f}x | {inside} | "
        f"{stats.tokens_per_step:.2f} | {accepted or '-'} | {cost} |"
    )


def write_json(path, report) -> None:
    if path:
        Path(path).write_text(json.dumps(report, indent=2))
