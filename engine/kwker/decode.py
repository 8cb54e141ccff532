"""Deprecated: kwker.hf.decoder (or kwker.hf) has KwkDecoder, install, uninstall, and
runner_unsupported as unsupported_reason; kwker.hf.CompiledDecoder is what was Decoder here."""

from kwker._deprecation import moved_module, old_names
from kwker.hf.decoder import KwkDecoder, install, uninstall, unsupported_reason
from kwker.loading.build import KV_CACHE_TYPES, default_threads

moved_module(__name__, "kwker.hf.decoder")
__getattr__ = old_names(
    __name__,
    {
        "runner_unsupported": "kwker.hf.decoder.unsupported_reason",
        "Decoder": "kwker.hf.compiled.CompiledDecoder",
    },
    rest="kwker.hf.decoder",
)
__all__ = [
    "KV_CACHE_TYPES", "KwkDecoder", "default_threads", "install", "uninstall", "unsupported_reason",
]  # fmt: skip
