#!/usr/bin/env bash
# Cross-builds the native core for 64-bit Windows with Debian's MinGW-w64, and runs the result
# under Wine where Wine is installed. What it builds is native/check/core_check.cpp with every
# kernel, format and the system layer (CMake's KWKER_CORE_ONLY), linked statically into one .exe;
# the pybind11 bindings are not built (that needs a Windows Python's headers and import library).
#
#   scripts/cross_build_windows.sh [--clang] [BUILD_DIR]     (default build/mingw or build/mingw-clang)
#
# --clang compiles with clang++-19 for the same target (MinGW's headers and libraries). Needs
# `apt-get install mingw-w64` (and clang-19 for --clang; wine64 to run). Exits 2 when the compiler
# is missing. tests/native/test_portable_build.py runs it.
set -euo pipefail
cd "$(dirname "$0")/.."

CLANG=""
if [[ "${1:-}" == "--clang" ]]; then
  CLANG=clang++-19
  shift
fi
BUILD="$(realpath -m "${1:-build/mingw${CLANG:+-clang}}")"
for tool in x86_64-w64-mingw32-g++-posix $CLANG; do
  if ! command -v "$tool" > /dev/null; then
    echo "cross_build_windows: no $tool (apt-get install mingw-w64${CLANG:+ clang-19})" >&2
    exit 2
  fi
done

ARGS=(-DCMAKE_TOOLCHAIN_FILE="$PWD/native/check/mingw-w64.cmake" -DKWKER_CORE_ONLY=ON
      -DKWKER_STATIC_RUNTIME=ON -DCMAKE_BUILD_TYPE=Release)
[[ -n "$CLANG" ]] && ARGS+=(-DKWKER_MINGW_CLANG="$CLANG")
command -v ninja > /dev/null && ARGS+=(-G Ninja)
# the avx512-emulated kernels too, where SIMDe's headers are at hand (the simde-py package)
SIMDE="$(python3 -c 'import simde_py; print(simde_py.get_include())' 2> /dev/null || true)"
[[ -n "$SIMDE" ]] && ARGS+=(-DSIMDE_INCLUDE_DIR="$SIMDE")

START=$SECONDS
mkdir -p "$BUILD"
cmake -S . -B "$BUILD" "${ARGS[@]}" > "$BUILD/configure.log" 2>&1 \
  || { cat "$BUILD/configure.log" >&2; exit 1; }
cmake --build "$BUILD" -j "${JOBS:-2}"
EXE="$BUILD/kwker_core_check.exe"
echo "built $EXE in $((SECONDS - START)) s"

# A PE32+ x86-64 program that needs nothing but Windows' own DLLs (the C++ runtime and the
# threads library linked in).
x86_64-w64-mingw32-objdump -f "$EXE" | grep -q 'file format pei-x86-64'
DLLS="$(x86_64-w64-mingw32-objdump -p "$EXE" | sed -n 's/^\s*DLL Name: //p' | sort -u | tr '\n' ' ')"
echo "imports: $DLLS"
for dll in $DLLS; do
  case "${dll,,}" in
    kernel32.dll | msvcrt.dll | api-ms-win-*) ;;
    *) echo "cross_build_windows: $EXE needs $dll" >&2; exit 1 ;;
  esac
done

WINE="$(command -v wine64 || command -v wine || ls /usr/lib/wine/wine64 2> /dev/null || true)"
if [[ -z "$WINE" ]]; then
  echo "not run: no Wine (apt-get install wine64)"
  exit 0
fi
export WINEPREFIX="$BUILD/wineprefix" WINEDEBUG=-all
"$WINE" "$EXE"
