#!/usr/bin/env bash
# The bindings' fuzz test (tests/native/test_bindings.py) and the kernel parity tests on a build of the native
# module with AddressSanitizer and UndefinedBehaviorSanitizer. Run from the repository root in the dev venv:
#   native/fuzz_sanitized.sh [ITERATIONS]       (default 5000; takes a few minutes)
# It builds into build/sanitize (apart from the installed module), then runs pytest on a copy of the Python
# package that holds the sanitized module, with the ASan runtime preloaded (Python itself is not instrumented).
set -euo pipefail
cd "$(dirname "$0")/.."
ITERATIONS="${1:-5000}"
BUILD=build/sanitize
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKWKER_SANITIZE=ON \
  -DPython_EXECUTABLE="$(command -v python)" -Dpybind11_DIR="$(python -m pybind11 --cmakedir)" > /dev/null
cmake --build "$BUILD" -j "$(nproc)"
PKG="$BUILD/pkg"
rm -rf "$PKG" && mkdir -p "$PKG" && cp -r engine/kwker "$PKG/kwker"
cp "$BUILD"/_native*.so "$PKG/kwker/"
# the editable install's import hook would find the normal module first: drop it, put the copy first
cat > "$PKG/sitecustomize.py" <<'PY'
import sys
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in type(f).__module__.lower()
                    and "scikit_build" not in type(f).__module__.lower()]
PY
export PYTHONPATH="$PWD/$PKG"
export LD_PRELOAD="$(gcc -print-file-name=libasan.so):$(gcc -print-file-name=libubsan.so)"
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1  # CPython's own allocations are not ours to report
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
python -c "import kwker._native as n; assert '$PKG' in n.__file__, n.__file__; print('sanitized module:', n.__file__)"
KWKER_FUZZ_ITERATIONS="$ITERATIONS" python -m pytest -q -p no:cacheprovider tests/native/test_bindings.py \
  tests/native/test_kernels.py -x "${@:2}"
