"""What this CPU can run: `decoder_available()` and the instruction set the kernels use."""

from __future__ import annotations

import os

from kwker import _native


def forced_isa() -> str:
    """The ISA that KWKER_ISA forces ('' when unset)."""
    return os.environ.get("KWKER_ISA", "").strip().lower()


def best_isa() -> str:
    """The ISA a new decoder would use here: KWKER_ISA when set, else the best the CPU has."""
    return forced_isa() or _native.isa_best()


def decoder_available() -> bool:
    """True when this CPU runs KwkDecoder with a SIMD kernel set (AVX2+FMA+F16C or AVX-512).

    The portable reference kernels run anywhere but are far too slow to be worth it;
    KWKER_ISA=generic forces them anyway (tests use it as an oracle).
    """
    isa = forced_isa()
    if isa:
        return _native.isa_supported(isa)
    return _native.isa_best() != "generic"
