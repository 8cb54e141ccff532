"""llama-cpp-python, kept off its AMX matmul on CPUs that have AMX.

llama.cpp is kwker's peer (`kwker bench`, `kwker quality`) and a third-party server in the tests.
Its AMX kernels (ggml-cpu/amx/mmq.cpp) load their tile configuration with GCC 12's
`_tile_loadconfig`, whose asm operand covers only the first 8 bytes of the 64-byte configuration.
GCC then drops the stores of the tiles' rows and widths, `ldtilecfg` reads an invalid configuration,
and the process dies of SIGSEGV at its first matmul of more than one row (the prompt). Seen with
llama-cpp-python 0.3.36 built from source by Debian 12's GCC 12.2 on a Xeon with AMX: the
disassembly stores 32 zero bytes and the palette id, then `ldtilecfg`; llama.cpp issue #20824.

llama.cpp puts weights in its AMX buffers only as an "extra buffer type", so a model loaded with
`use_extra_bufts = False` runs every matmul on its AVX-512 kernels. That also turns off its weight
repacking (also an extra buffer type), so on such a CPU the peer runs without it, and says so
(`NOTE`). On a CPU without AMX nothing changes.
"""

from __future__ import annotations

import functools
from pathlib import Path

NOTE = "without its AMX and repacked weight buffers (its AMX matmul crashes here, llama.cpp #20824)"


@functools.cache
def cpu_has_amx() -> bool:
    """Whether the kernel reports AMX's int8 tiles (Linux; elsewhere, no)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return any(
        line.startswith("flags") and "amx_int8" in line.split() for line in text.splitlines()
    )


def keep_llama_cpp_off_amx() -> bool:
    """From now on in this process, llama_cpp.Llama loads its weights without extra buffer types on
    a CPU with AMX. Returns whether it does (and the peer runs without repacked weights).
    Idempotent."""
    if not cpu_has_amx():
        return False
    import llama_cpp.llama_cpp as lib  # llama_cpp.Llama reads its defaults from here at each load

    default = lib.llama_model_default_params
    if getattr(default, "kwker_off_amx", False):
        return True

    def params():
        p = default()
        p.use_extra_bufts = False
        return p

    params.kwker_off_amx = True
    lib.llama_model_default_params = params
    return True
