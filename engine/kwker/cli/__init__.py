"""The `kwker` command: generate, bench, serve and models (parser: the arguments; generate,
models: those commands)."""

from __future__ import annotations

import os
import sys

from kwker.cli.generate import AnswerOut
from kwker.cli.parser import build_parser

__all__ = ["AnswerOut", "build_parser", "main"]

# The extra that brings a module an optional part of kwker imports, by the module's top-level name.
EXTRAS = {
    "fastapi": "serve",
    "uvicorn": "serve",
    "prometheus_client": "serve",
    "starlette": "serve",
    "torch": "hf",
    "transformers": "hf",
    "accelerate": "hf",
    "llama_cpp": "bench",
    "PySide6": "chat",
}


def missing_extra(error: ModuleNotFoundError) -> str | None:
    """The one line to print for a missing optional dependency, or None if it is not one."""
    top = (error.name or "").partition(".")[0]
    extra = EXTRAS.get(top)
    if extra is None:
        return None
    return f'kwker: this needs {top}, from the "{extra}" extra: pip install "kwker[{extra}]"'


def main(argv=None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # transformers' notice that torch is missing means nothing here (the bench's peers without it)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    args = build_parser().parse_args(argv)
    if getattr(args, "temperature", None) is None and getattr(args, "seed", None) is not None:
        args.temperature = 0.7
    if getattr(args, "temperature", 0) is None:
        args.temperature = 0.0
    try:
        return args.func(args)
    except ModuleNotFoundError as e:
        line = missing_extra(e)
        if line is None:
            raise
        print(line, file=sys.stderr)
        return 2
    except (ValueError, RuntimeError, OSError) as e:
        print(f"kwker: {e}", file=sys.stderr)
        return 2
