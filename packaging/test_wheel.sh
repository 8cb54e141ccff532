#!/usr/bin/env bash
# The binary wheel as a pip user gets it: installed into a fresh venv on a PATH without any C or C++
# compiler (symlinks to /usr/bin minus the compilers and the linker), then tests run from this
# checkout against the installed package (not the sources).
#   packaging/test_wheel.sh                # the tests of the native module, the loader, the app's
#                                          # self-test and basics (about 7 min)
#   packaging/test_wheel.sh tests          # the README's whole suite (about 30 min)
set -euo pipefail
cd "$(dirname "$0")/.."
WHEEL=$(ls dist/kwker-*-manylinux*.whl | tail -1)
BIN=$(mktemp -d /tmp/kwker-nocc-bin.XXXX)
for f in /usr/bin/*; do
  case $(basename "$f") in
    gcc* | g++* | cc | c++ | cpp* | *-gcc* | *-g++* | clang* | x86_64-linux-gnu-* | ld | ld.* | as) ;;
    *) ln -s "$f" "$BIN/$(basename "$f")" ;;
  esac
done
export PATH=$BIN
if command -v gcc || command -v g++ || command -v cc; then echo "a compiler is still on PATH" >&2; exit 1; fi
VENV=$(mktemp -d /tmp/kwker-wheel-venv.XXXX)
python3 -m venv "$VENV" && . "$VENV/bin/activate"
pip install -q "$WHEEL[test]"
python -c "import kwker, kwker._native as n; print('installed:', kwker.__file__, 'best ISA:', n.isa_best())"
if (($#)); then
  python -m pytest -q -p no:cacheprovider "$@"
else
  python -m pytest -q -p no:cacheprovider tests/native tests/engine/test_file_loading.py \
    tests/engine/test_bundled.py tests/app/test_self_test.py tests/app/test_ui_basics.py
fi
