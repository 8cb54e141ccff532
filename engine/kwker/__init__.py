"""Kwker: fast, exact LLM inference on a plain CPU."""

__version__ = "0.1.0"
