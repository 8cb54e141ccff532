"""Deprecated: kwker.hf.compiled, where Decoder is CompiledDecoder."""

from kwker._deprecation import moved_module, old_names
from kwker.hf.compiled import CompiledDecoder, CompiledStep, compile_package, package_key

moved_module(__name__, "kwker.hf.compiled")
__getattr__ = old_names(
    __name__, {"Decoder": "kwker.hf.compiled.CompiledDecoder"}, rest="kwker.hf.compiled"
)
__all__ = ["CompiledDecoder", "CompiledStep", "compile_package", "package_key"]
