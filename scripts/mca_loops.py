"""Static cycle counts of kernel tiles' hot loops (perf-notes #21, #22): for each function of a GCC
.s file whose symbol contains one of the pieces given, its innermost backward-branching block that
holds the most instructions matching KEY (the useful multiply-adds), run through llvm-mca; then the
same block with those instructions deleted ("rest": the work the chip cannot hide behind them).

    python scripts/mca_loops.py v.s vdpbf16ps znver5 'bf16p_tileINS_12_GLOBAL__N_16Avx512ELi6ELi4E'

Prints one row per function: symbol piece | KEY instructions | cycles per iteration | rest | rest
per KEY instruction | stack references in the loop (spills).
"""

import re
import subprocess
import sys


def hot_loop(lines: list[str], symbol: str, key: str) -> list[str]:
    start = next(i for i, line in enumerate(lines) if line.startswith(symbol + ":"))
    end = next(i for i in range(start, len(lines)) if ".cfi_endproc" in lines[i])
    body = lines[start:end]
    labels = {line[:-1]: i for i, line in enumerate(body) if re.match(r"^\.L\w+:$", line)}
    best = None
    for i, line in enumerate(body):
        m = re.match(r"\s+j\w+\s+(\.L\w+)$", line)
        if m and labels.get(m.group(1), i) < i:
            block = body[labels[m.group(1)] + 1 : i + 1]
            n = sum(key in x for x in block)
            if best is None or n > best[0] or (n == best[0] and len(block) < len(best[1])):
                best = (n, block)
    return [
        x for x in best[1] if x.strip() and not x.strip().startswith(".") and not x.endswith(":")
    ]


def cycles(instructions: list[str], cpu: str, iterations: int = 200) -> float:
    out = subprocess.run(
        ["llvm-mca-19", f"-mcpu={cpu}", f"-iterations={iterations}"],
        input="\n".join(instructions) + "\n",
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return int(re.search(r"Total Cycles:\s+(\d+)", out).group(1)) / iterations


def main() -> None:
    path, key, cpu, *pieces = sys.argv[1:]
    lines = open(path).read().split("\n")
    symbols = [line[:-1] for line in lines if re.match(r"^_Z\w+:$", line)]
    for piece in pieces:
        symbol = next(s for s in symbols if piece in s)
        loop = hot_loop(lines, symbol, key)
        n = sum(key in x for x in loop)
        total, rest = cycles(loop, cpu), cycles([x for x in loop if key not in x], cpu)
        spills = sum("(%rsp)" in x or "(%rbp)" in x for x in loop)
        print(f"{piece} | {n} | {total:.2f} | {rest:.2f} | {rest / n:.3f} | {spills}")


if __name__ == "__main__":
    main()
