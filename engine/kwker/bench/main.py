"""`kwker bench`'s entry, and its default run: prefill and generation of kwker and its peers
against the roofline."""

from __future__ import annotations

import statistics

from kwker.bench import measure, report
from kwker.bench.peers import KwkerEngine, peer_engines
from kwker.precision import quantized


def main(args) -> int:
    """Runs what `kwker bench`'s parsed arguments ask for and writes --json."""
    peers = [p.strip() for p in (args.vs or "").split(",") if p.strip()]
    if args.quality:
        from kwker.bench import quality

        result = quality.run(args.model, threads=args.threads, peers=peers)
    elif args.lookup or args.draft:
        from kwker.bench.speculation import run_speculative

        result = run_speculative(
            args.model,
            precision=args.precision,
            threads=args.threads,
            draft_spec=args.draft,
            repeats=args.repeats,
            draft_precision=args.draft_precision,
        )
    elif args.batch:
        from kwker.bench.batch import run_batch

        result = run_batch(
            args.model,
            precision=args.precision,
            threads=args.threads,
            batches=[int(b) for b in args.batch.split(",")],
            tg=args.tg,
            repeats=args.repeats,
        )
    else:
        result = run(
            args.model,
            precision=args.precision,
            threads=args.threads,
            repeats=args.repeats,
            pp=args.pp,
            tg=args.tg,
            depth=args.depth,
            peers=peers,
            source_only=args.source_only,
        )
    report.write_json(args.json, result)
    return 0


def run(
    model_spec=None,
    precision=None,
    threads=None,
    repeats=5,
    pp=512,
    tg=128,
    depth=16,
    peers=(),
    out=print,
    source_only=False,
) -> dict:
    """pp<pp> and tg<tg> (after `depth` tokens of context) tokens/s of kwker and `peers`, run
    alternately in one process on the same weights and threads. kwker loads the model's files as
    the app does (precision None: the nearest to the files' own)."""
    from kwker.loading.build import default_threads
    from kwker.models.loader import DEFAULT_MODEL, resolve_model

    threads = threads or default_threads()
    limits = measure.machine_limits(threads)
    out(report.machine_line(limits, threads))
    name = model_spec or DEFAULT_MODEL
    n_ctx = max(pp, depth) + tg + 32
    engines = [KwkerEngine(resolve_model(model_spec), precision, threads, n_ctx)]
    precision = engines[0].dec.precision
    config = engines[0].dec.config
    engines += peer_engines(peers, model_spec, precision, threads, n_ctx, out, source_only)
    out(report.model_line(name, precision, threads, engines[0].bytes_per_token))

    vocab = config.vocab_size
    # the generation test decodes after `depth` tokens of context (llama-bench's tg128 @ d<depth>)
    pp_tokens, tg_prompt = (
        measure.prompt_tokens(pp, vocab),
        measure.prompt_tokens(depth, vocab, seed=1),
    )
    pp_name = f"pp{pp}"
    tg_name = f"tg{tg}" if depth == 16 else f"tg{tg}@d{depth}"
    is_quantized = quantized(precision)
    timings = measure.time_engines(
        engines, pp_tokens, pp_name, tg_prompt, tg, tg_name, repeats, threads, is_quantized
    )
    # This shared host's speed drifts by tens of percent over minutes: generation's fraction of the
    # roofline is its median over the median of the probes taken beside it (the machine line is the
    # best of its probes).
    bw = statistics.median(timings.probes)
    out(report.bandwidth_line(timings.probes, bw, threads))
    # Prefill's ceiling: the multiply-accumulates of the layers' matrices per token at the compute
    # peak of the precision's kernels, the median of the peaks measured beside the prefill runs.
    macs = measure.prefill_macs_per_token(config)
    peak = statistics.median(timings.peaks)
    kind = "int8" if is_quantized else "fp32"
    out(report.peak_line(timings.peaks, peak, kind, threads))
    for line in report.RESULTS_HEADER:
        out(line)
    rows = []
    for r in timings.results.values():
        line, row = report.result_row(r, macs, bw, peak, kind)
        out(line)
        rows.append(row)
    ratios = {
        f"{t} kwker/{e.name}": timings.results[("kwker", t)].median
        / timings.results[(e.name, t)].median
        for e in engines[1:]
        for t in (pp_name, tg_name)
    }
    for line in report.ratio_lines(ratios):
        out(line)
    alone = measure.steady_rss(model_spec, precision, threads)
    result = {
        "model": name,
        "precision": precision or "model dtype",
        "threads": threads,
        "machine": limits
        | {
            "read_gb_s_beside_runs": timings.probes,
            "compute_peak_gmac_s_beside_runs": timings.peaks,
        },
        "roofline_tg_tokens_per_s": bw * 1e9 / engines[0].bytes_per_token,
        "results": rows,
        "ratios": ratios,
        "rss_mb": {
            "peak": measure.peak_rss_mb(),
            "now": measure.current_rss_mb(),
            "steady_alone": alone["steady"],
            "peak_alone": alone["peak"],
        },
    }
    for line in report.memory_lines(result, alone):
        out(line)
    return result
