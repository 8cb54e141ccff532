"""The native code beyond Linux and GCC: the ISA checks read CPUID as Linux does, the portable fma
that the reference kernels use on Windows rounds once, and the native core cross-builds for Windows
with MinGW-w64 (scripts/cross_build_windows.sh), running under Wine where Wine is installed."""

import re
import shutil
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from kwker import _native

ROOT = Path(__file__).resolve().parents[2]
# _native.cpu_features() names -> /proc/cpuinfo's
CPUINFO_NAMES = {
    "avx2": "avx2",
    "fma": "fma",
    "f16c": "f16c",
    "avx512f": "avx512f",
    "avx512bw": "avx512bw",
    "avx512vl": "avx512vl",
    "avx512dq": "avx512dq",
    "avx512vnni": "avx512_vnni",
    "avx512bf16": "avx512_bf16",
}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/cpuinfo")
def test_cpu_features_and_isa_choice_are_what_linux_reports():
    flags = set(
        re.search(r"^flags\s*:(.*)$", Path("/proc/cpuinfo").read_text(), re.M).group(1).split()
    )
    features = _native.cpu_features()
    assert features == {name: CPUINFO_NAMES[name] in flags for name in CPUINFO_NAMES}
    avx2 = all(features[f] for f in ("avx2", "fma", "f16c"))
    avx512 = avx2 and all(
        features[f] for f in ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512vnni")
    )
    assert (_native.isa_supported("avx2"), _native.isa_supported("avx512")) == (avx2, avx512)
    assert _native.isa_best() == ("avx512" if avx512 else "avx2" if avx2 else "generic")


def rounded_once(a, b, c):
    """a * b + c computed exactly and rounded to the nearest float32, ties to even."""
    exact = Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c))
    guess = np.float32(float(exact))
    near = [
        np.nextafter(guess, np.float32(-np.inf)),
        guess,
        np.nextafter(guess, np.float32(np.inf)),
    ]
    return min(
        near, key=lambda f: (abs(Fraction(float(f)) - exact), int(np.array(f).view(np.uint32)) & 1)
    )


def fma_cases(rng, n):
    """Products across the float range with addends that are random, cancel the product, or are
    subnormal; and sums just short of halfway between two floats (c + ulp(c) / 2 * (1 - k^2 2^-46)),
    where a double rounding lands on the tie."""

    def floats(size):
        signs = rng.choice([-1.0, 1.0], size)
        return np.ldexp(rng.uniform(1, 2, size) * signs, rng.integers(-70, 60, size)).astype(
            np.float32
        )

    a, b, c = floats(n), floats(n), floats(n)
    c[1::4] = -(a[1::4] * b[1::4])
    sub = c[2::4]  # subnormals of either sign
    bits = rng.integers(1, 1 << 23, sub.size, dtype=np.uint32)
    sub[:] = (bits | rng.integers(0, 2, sub.size, dtype=np.uint32) << 31).view(np.float32)
    k = rng.integers(1, 64, c[3::4].size).astype(np.float32) * np.float32(2**-23)
    a[3::4] = (1 + k) * np.sign(c[3::4])
    b[3::4] = (1 - k) * np.spacing(np.abs(c[3::4])) / 2
    return a, b, c


def test_fma_exact_rounds_once():
    a, b, c = fma_cases(np.random.default_rng(0), 3000)
    want = np.array([rounded_once(*t) for t in zip(a, b, c, strict=True)], np.float32)
    got = _native.kernel_fma_exact(a, b, c)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    # the cases reach what a product and sum in double, rounded to float32 after, gets wrong
    twice = (a.astype(np.float64) * b + c).astype(np.float32)
    assert (twice != want).sum() > 100


MINGW = shutil.which("x86_64-w64-mingw32-g++-posix")
WINE = shutil.which("wine64") or shutil.which("wine") or shutil.which("/usr/lib/wine/wine64")


@pytest.fixture(scope="module")
def cross_build(tmp_path_factory):
    """scripts/cross_build_windows.sh into a fresh directory: (the build, its output)."""
    build = tmp_path_factory.mktemp("mingw")
    done = subprocess.run(
        ["bash", ROOT / "scripts/cross_build_windows.sh", build],
        capture_output=True,
        text=True,
        timeout=1800,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return build, done.stdout


@pytest.mark.cross_build
@pytest.mark.skipif(not MINGW, reason="no MinGW-w64 cross compiler (apt-get install mingw-w64)")
def test_native_core_cross_builds_for_windows_with_mingw(cross_build):
    build, out = cross_build
    exe = (build / "kwker_core_check.exe").read_bytes()
    assert exe[:2] == b"MZ" and exe[exe.index(b"PE\0\0") + 4 :][:2] == b"\x64\x86"  # PE, x86-64
    imports = re.search(r"^imports: (.*)$", out, re.M).group(1).split()
    assert sorted(i.lower() for i in imports) == ["kernel32.dll", "msvcrt.dll"]  # runtime linked in


@pytest.mark.cross_build
@pytest.mark.skipif(not MINGW, reason="no MinGW-w64 cross compiler (apt-get install mingw-w64)")
@pytest.mark.skipif(not WINE, reason="no Wine to run the Windows build (apt-get install wine64)")
def test_windows_build_gives_the_reference_bits_under_wine(cross_build):
    _, out = cross_build
    assert re.search(r"^best isa: (\S+)$", out, re.M).group(1) == _native.isa_best()
    assert re.search(r"^fma_exact: 0 of \d+ results differ", out, re.M)
    for isa in ("generic", "avx2", "avx512"):
        ran = f"{isa}: the generic kernels' bits for every format, alone and batched" in out
        assert ran == _native.isa_supported(isa)
    assert "core check passed" in out
