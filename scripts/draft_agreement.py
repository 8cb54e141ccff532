"""How often a draft's top token is its target's, teacher-forced on the target's greedy answers, per
text; with --skip, for copies of the draft without some of its layers (perf-notes #40). A draft
is worth its bytes only if it keeps this share: the question behind a cheaper draft.

    python scripts/draft_agreement.py TARGET.gguf DRAFT.gguf [--precision int4] [--tokens 160]
        [--skip 9,10 --skip 9,10,13 ...] [--each-layer]

The texts are the bench's four and four more. Answers are greedy at --precision; the draft runs at
kwker.precision.DRAFT with its full head; an answer ends at its end-of-turn token, as in generate.
"""

import argparse
import re
import tempfile
from pathlib import Path

import gguf
import numpy as np

from kwker.bench.speculation import TASKS
from kwker.loading.load import load_files
from kwker.precision import DRAFT

TEXTS = {
    **TASKS,
    "explain": "Explain how photosynthesis works to a ten-year-old.",
    "csv": "Write a Python function that reads a CSV file and returns the average of a named column.",
    "js": "Translate this Python to JavaScript:\n\ndef count_words(text):\n    counts = {}\n"
    "    for w in text.split():\n        counts[w] = counts.get(w, 0) + 1\n    return counts\n",
    "email": "Write a short, polite email asking my landlord to fix a leaking kitchen tap.",
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("target")
    ap.add_argument("draft")
    ap.add_argument("--precision", default="int4")
    ap.add_argument("--tokens", type=int, default=160)
    ap.add_argument("--skip", action="append", default=[], help="layers to leave out, e.g. 9,10")
    ap.add_argument("--each-layer", action="store_true", help="also each layer left out alone")
    args = ap.parse_args()
    answers = greedy_answers(args.target, args.precision, args.tokens)
    variants = [()] + [tuple(int(i) for i in s.split(",")) for s in args.skip]
    if args.each_layer:
        variants += [(i,) for i in range(block_count(args.draft))]
    print("| layers left out | weight bytes a token | mean | " + " | ".join(TEXTS) + " |")
    with tempfile.TemporaryDirectory() as tmp:
        for skip in variants:
            path = without_layers(args.draft, set(skip), Path(tmp) / "draft.gguf")
            shares, nbytes = agreement(path, answers)
            cells = " | ".join(f"{shares[t]:.3f}" for t in TEXTS)
            name = ", ".join(map(str, skip)) or "none"
            mean = float(np.mean(list(shares.values())))
            print(f"| {name} | {nbytes / 1e6:.0f} MB | {mean:.3f} | {cells} |", flush=True)


def greedy_answers(target: str, precision: str, n: int) -> dict:
    """Per text: (prompt ids, the target's greedy answer of at most n tokens)."""
    dec = load_files(target, max_cache_len=1024, precision=precision)
    out = {}
    for task, text in TEXTS.items():
        chat = [{"role": "user", "content": text}]
        prompt_text = dec.tokenizer.apply_chat_template(
            chat, add_generation_prompt=True, tokenize=False
        )
        prompt = list(dec.tokenizer(prompt_text, add_special_tokens=False)["input_ids"])
        answer = dec.generate(prompt, max_new_tokens=n, lookup=0)[0, len(prompt) :].tolist()
        out[task] = (prompt, answer)
    return out


def agreement(draft: Path, answers: dict) -> tuple[dict, int]:
    """Per text, the share of answer tokens that are the draft's top token after the same prefix;
    and the draft's weight bytes a token."""
    run = load_files(draft, max_cache_len=1024, precision=DRAFT, cache=False).runner
    shares = {}
    for task, (prompt, answer) in answers.items():
        slot = run.acquire()
        rows = run.extend_slot(slot, 0, prompt + answer[:-1], rows="all")
        top = np.asarray(rows.argmax)[len(prompt) - 1 :]
        shares[task] = float(np.mean(top == np.asarray(answer)))
        run.release(slot)
    return shares, run.weight_bytes_per_token


def block_count(path: str) -> int:
    return _block_count(gguf.GGUFReader(path))


def _block_count(r: gguf.GGUFReader) -> int:
    arch = r.fields["general.architecture"].contents()
    return int(r.fields[f"{arch}.block_count"].contents())


def without_layers(src: str, skip: set[int], dst: Path) -> Path:
    """A copy of the GGUF at src without the blocks in skip: the others renumbered in order, the
    block count lowered, everything else as it was. With nothing to skip: src itself."""
    if not skip:
        return Path(src)
    r = gguf.GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    keep = [i for i in range(_block_count(r)) if i not in skip]
    new_index = {old: new for new, old in enumerate(keep)}
    w = gguf.GGUFWriter(dst, arch=arch, endianess=r.endianess)
    for field in r.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue  # written by GGUFWriter itself
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        value = len(keep) if field.name == f"{arch}.block_count" else field.contents()
        w.add_key_value(field.name, value, kind, sub_type=sub)
    tensors = []
    for t in r.tensors:
        m = re.match(r"blk\.(\d+)\.(.*)", t.name)
        if m and int(m.group(1)) in skip:
            continue
        name = f"blk.{new_index[int(m.group(1))]}.{m.group(2)}" if m else t.name
        w.add_tensor_info(name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
        tensors.append(t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for t in tensors:
        w.write_tensor_data(t.data, tensor_endianess=r.endianess)
    w.close()
    return dst


if __name__ == "__main__":
    main()
