"""Seeded damage to real model files, for the loaders' fuzzer (a helper module, not tests):
tests/engine/test_loader_fuzz.py runs a few hundred cases in CI, scripts/fuzz_loaders.py runs
thousands.

A case takes one of three kinds of tiny model that loads -- a GGUF, a safetensors folder (every
model type kwker runs, one of them sharded), the packed-cache entry of the GGUF -- and damages one
thing in it: a header field set to a value picked to hurt (0, -1, 2^31, 2^32, 2^63, NaN, inf, a
string or a list where a number is meant), a count, a length, an offset, a type id, a metadata
entry dropped, added or retyped, a tensor renamed, bits flipped, a deep nesting, the file cut
short. It then loads the result as `kwker generate` does (and checks it as `kwker models import`
does) and says how that ended:

    refused   a BadModelFile, the one error a damaged file may raise
    loaded    a clean load that generates (the damage did not matter, e.g. in a name's text)
    rebuilt   a damaged cache entry packed again: the model answers as the undamaged one does,
              and the next load reads the new entry back
    reused    a cache entry whose damage did not matter (its padding): the same answers

Anything else is a failure, reported with the case's description: another exception type, a cache
entry that answers differently, debris left in the cache, or an import that refuses what loads.
`run_case(models, seed, index, scratch)` is deterministic, so a failing case reruns alone.
"""

from __future__ import annotations

import json
import math
import os
import random
import resource
import shutil
import struct
import time
import traceback
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
from loading_files import value as gguf_value

from kwker.loading.errors import BadModelFile
from kwker.loading.load import load_files
from kwker.models.imported import check_runs

PRECISION = "int4"  # the cache entry's: its matrices are Q4, the "wtype" flip
PROMPT = [0, 1, 2]

# ---- the undamaged models ------------------------------------------------------------------------

# The tiny shape every model here has: small enough that a load takes milliseconds
VOCAB, HIDDEN, FF, LAYERS, HEADS, KV_HEADS, HEAD_DIM, POSITIONS = 128, 64, 128, 2, 4, 2, 16, 256


def tiny_config(model_type: str) -> dict:
    """A config.json of the tiny shape for `model_type`, with the fields its class reads."""
    config = {
        "model_type": model_type,
        "vocab_size": VOCAB,
        "hidden_size": HIDDEN,
        "intermediate_size": FF,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "max_position_embeddings": POSITIONS,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": model_type == "gemma3_text",
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "bfloat16",
    }
    if model_type == "llama":  # the scaling Llama 3.x states
        config["rope_scaling"] = {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 128,
        }
    elif model_type == "qwen2":
        config.update(use_sliding_window=True, sliding_window=32, max_window_layers=1)
    elif model_type == "mistral":
        config["sliding_window"] = 32
    elif model_type == "gemma3_text":
        config.update(
            hidden_activation="gelu_pytorch_tanh",
            query_pre_attn_scalar=HEAD_DIM,
            sliding_window=32,
            sliding_window_pattern=2,
            rope_local_base_freq=10000.0,
        )
    elif model_type == "phi3":
        config.update(partial_rotary_factor=0.5, original_max_position_embeddings=POSITIONS)
    return config


def tiny_tensors(model_type: str) -> dict[str, tuple[int, ...]]:
    """The Hugging Face tensors (name: shape) of the tiny model of `model_type`, written out
    here rather than asked of kwker's families, so that the files are the formats' own word."""
    q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    shapes = {"model.embed_tokens.weight": (VOCAB, HIDDEN), "model.norm.weight": (HIDDEN,)}
    norms = ["input_layernorm", "post_attention_layernorm"]
    if model_type == "gemma3_text":
        norms += ["pre_feedforward_layernorm", "post_feedforward_layernorm"]
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        shapes.update({f"{p}{n}.weight": (HIDDEN,) for n in norms})
        if model_type == "phi3":  # fused q/k/v and gate/up
            shapes[p + "self_attn.qkv_proj.weight"] = (q + 2 * kv, HIDDEN)
            shapes[p + "mlp.gate_up_proj.weight"] = (2 * FF, HIDDEN)
        else:
            for name, rows in (("q", q), ("k", kv), ("v", kv)):
                shapes[f"{p}self_attn.{name}_proj.weight"] = (rows, HIDDEN)
                if model_type == "qwen2":
                    shapes[f"{p}self_attn.{name}_proj.bias"] = (rows,)
            shapes[p + "mlp.gate_proj.weight"] = (FF, HIDDEN)
            shapes[p + "mlp.up_proj.weight"] = (FF, HIDDEN)
        shapes[p + "self_attn.o_proj.weight"] = (HIDDEN, q)
        shapes[p + "mlp.down_proj.weight"] = (HIDDEN, FF)
        if model_type in ("qwen3", "gemma3_text"):
            shapes[p + "self_attn.q_norm.weight"] = (HEAD_DIM,)
            shapes[p + "self_attn.k_norm.weight"] = (HEAD_DIM,)
    if model_type != "gemma3_text":
        shapes["lm_head.weight"] = (VOCAB, HIDDEN)
    return shapes


def safetensors_bytes(tensors: dict[str, np.ndarray]) -> bytes:
    """A safetensors file of float32 or bfloat16 (uint16) arrays: 8 bytes of header length, the
    JSON header (padded with spaces to 8 bytes, as the format's writer pads), then the data."""
    header, data = {}, bytearray()
    for name, array in tensors.items():
        dtype = "BF16" if array.dtype == np.uint16 else "F32"
        header[name] = {"dtype": dtype, "shape": list(array.shape),
                        "data_offsets": [len(data), len(data) + array.nbytes]}  # fmt: skip
        data += array.tobytes()
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text + bytes(data)


def write_folder(folder: Path, model_type: str, shards: int = 1, seed: int = 0) -> Path:
    """A safetensors folder of the tiny `model_type` model (config.json, weights in bfloat16;
    shards > 1: split with a model.safetensors.index.json), which loads without a tokenizer."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(tiny_config(model_type), indent=1))
    arrays = {}
    for name, shape in tiny_tensors(model_type).items():
        if len(shape) == 1:  # norms near 1 (Gemma's near 0: it scales by 1 + w), biases small
            values = rng.normal(0 if model_type == "gemma3_text" else 1, 0.1, shape)
        else:
            values = rng.normal(0, 0.05, shape)
        bits = values.astype(np.float32).view(np.uint32)
        arrays[name] = (bits >> 16).astype(np.uint16)  # bfloat16, truncated
    names = list(arrays)
    if shards == 1:
        (folder / "model.safetensors").write_bytes(safetensors_bytes(arrays))
        return folder
    weight_map = {}
    for k in range(shards):
        file = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: arrays[n] for n in names[k::shards]}
        (folder / file).write_bytes(safetensors_bytes(part))
        weight_map.update(dict.fromkeys(part, file))
    index = {"metadata": {}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
    return folder


def write_gguf(path: Path) -> Path:
    """A tiny llama GGUF of Q8_0 matrices, with a byte-level BPE tokenizer, as llama.cpp's
    converter lays it out (tests/synthetic_gguf.py)."""
    import synthetic_gguf as sg

    shape = replace(sg.SHAPES["tiny"], name="fuzz", layers=LAYERS, hidden=HIDDEN,
                    intermediate=FF, heads=HEADS, kv_heads=KV_HEADS, head_dim=HEAD_DIM * 2,
                    vocab=300, context=POSITIONS, rope_llama3=None, n_control=16)  # fmt: skip
    return sg.write_gguf(path, shape, "Q8_0")


FOLDER_TYPES = ("llama", "qwen2", "qwen3", "mistral", "gemma3_text", "phi3")


@dataclass
class Models:
    """The undamaged models a run damages copies of, written once."""

    gguf: Path
    folders: dict[str, Path]  # model type (and "sharded") -> folder
    cache: Path  # a KWKER_CACHE_DIR holding the GGUF's packed entry (and its tokenizer)
    entry: Path  # that entry, relative to `cache`
    answer: list[int]  # the GGUF model's greedy tokens for PROMPT


def make_models(root: Path) -> Models:
    root.mkdir(parents=True, exist_ok=True)
    gguf = write_gguf(root / "tiny.gguf")
    folders = {t: write_folder(root / t, t) for t in FOLDER_TYPES}
    folders["sharded"] = write_folder(root / "sharded", "llama", shards=2)
    cache = root / "cache"
    with cache_dir(cache):
        dec = load_files(gguf, 64, precision=PRECISION)
        answer = dec.generate(PROMPT, max_new_tokens=4)[0].tolist()
    (entry,) = (cache / "packed").glob("*.kwk")
    return Models(gguf, folders, cache, entry.relative_to(cache), answer)


class cache_dir:
    """Points KWKER_CACHE_DIR at `path` while in effect (the loader reads it at each load)."""

    def __init__(self, path: Path):
        self.path, self.before = path, None

    def __enter__(self):
        self.before = os.environ.get("KWKER_CACHE_DIR")
        os.environ["KWKER_CACHE_DIR"] = str(self.path)

    def __exit__(self, *exc):
        if self.before is None:
            os.environ.pop("KWKER_CACHE_DIR", None)
        else:
            os.environ["KWKER_CACHE_DIR"] = self.before


# ---- values picked to hurt -----------------------------------------------------------------------

INTS = [0, 1, 2, 3, 7, 8, 31, 32, 33, 255, 256, 1023, 1024, 1025, 2**15, 2**16, 2**31 - 1, 2**31,
        2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**64 - 1]  # fmt: skip
FLOATS = [math.nan, math.inf, -math.inf, -1.0, 0.0, -0.0, 1e-45, 1e-30, 3.0e38, 0.5, 2.0, 1e6]
JSON_INTS = [0, 1, 2, 3, -1, -(2**31), 2**31 - 1, 2**31, 2**32, 2**63, 2**64, 10**30, 10**400]
JSON_FLOATS = [math.nan, math.inf, -math.inf, -1.0, 0.0, -0.0, 1e-300, 1e-45, 1e300, 0.5, 1.5]
JSON_OTHERS = [True, False, None, "", "64", "abc", [], [1], [64, 64], {}, {"a": 1}, [[[]]]]


def json_value(rng: random.Random, old=None):
    """A JSON value to put where `old` was: one of the lists above, or a neighbour of `old`."""
    pick = rng.random()
    if old is not None and pick < 0.3:
        if isinstance(old, bool) or not isinstance(old, int | float):
            return rng.choice([str(old), [old], {"value": old}, 0, None])
        return rng.choice([old + 1, old - 1, old * 2, old // 2, -old, float(old), str(old),
                           [old], old * 1000, old + 0.5])  # fmt: skip
    if pick < 0.55:
        return rng.choice(JSON_INTS)
    if pick < 0.75:
        return rng.choice(JSON_FLOATS)
    return rng.choice(JSON_OTHERS)


def int_field(rng: random.Random, fmt: str, old: int) -> int:
    """A new value for the integer field of struct format `fmt` that holds `old`."""
    bits = struct.calcsize(fmt) * 8
    pick = rng.random()
    if pick < 0.5:
        new = rng.choice(INTS)
    elif pick < 0.8:
        new = old + rng.choice([-2, -1, 1, 2, 8, 32, 1000, old, -old // 2])
    else:
        new = old ^ (1 << rng.randrange(bits))  # one bit
    new %= 1 << bits  # as the file stores it
    if fmt[-1].islower():  # signed: the same bits
        new = new - (1 << bits) if new >= 1 << (bits - 1) else new
    return new


# ---- GGUF ----------------------------------------------------------------------------------------

# gguf.md's value types: the fixed-size ones as struct formats (8: string, 9: array)
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
           10: "<Q", 11: "<q", 12: "<d"}  # fmt: skip
RECORDED_ELEMENTS = 4  # of each array: a 300-token vocabulary is not 300 fields to pick from


@dataclass
class Field:
    at: int
    fmt: str
    kind: str  # count, length, type, scalar, dims, shape, offset, version
    label: str


@dataclass
class GgufLayout:
    """Where everything of a GGUF's header is, read independently of kwker's reader."""

    fields: list[Field] = field(default_factory=list)
    entries: list[tuple[str, int, int]] = field(default_factory=list)  # (key, start, end)
    tensors: list[tuple[str, int, int]] = field(default_factory=list)  # (name, start, end)
    header_end: int = 0
    data_start: int = 0
    alignment: int = 32


def gguf_layout(raw: bytes) -> GgufLayout:
    out, pos = GgufLayout(), 4

    def take(fmt: str, kind: str, label: str, record: bool = True):
        nonlocal pos
        if record:
            out.fields.append(Field(pos, fmt, kind, label))
        (v,) = struct.unpack_from(fmt, raw, pos)
        pos += struct.calcsize(fmt)
        return v

    def string(label: str, record: bool = True) -> str:
        nonlocal pos
        n = take("<Q", "length", label, record)
        pos += n
        return raw[pos - n : pos].decode()

    def value(vtype: int, label: str, record: bool = True):
        if vtype in SCALARS:
            return take(SCALARS[vtype], "scalar", label, record)
        if vtype == 8:
            return string(label, record)
        etype = take("<I", "type", f"{label} element type", record)
        count = take("<Q", "count", f"{label} count", record)
        return [value(etype, f"{label}[{i}]", record and i < RECORDED_ELEMENTS)
                for i in range(count)]  # fmt: skip

    take("<I", "version", "version")
    n_tensors = take("<Q", "count", "tensor count")
    n_entries = take("<Q", "count", "metadata count")
    for _ in range(n_entries):
        start = pos
        key = string("a key's length")
        v = value(take("<I", "type", f"{key} type"), key)
        if key == "general.alignment":
            out.alignment = v
        out.entries.append((key, start, pos))
    for _ in range(n_tensors):
        start = pos
        name = string("a tensor name's length")
        dims = take("<I", "dims", f"{name} dims")
        for k in range(dims):
            take("<Q", "shape", f"{name} ne[{k}]")
        take("<I", "type", f"{name} ggml type")
        take("<Q", "offset", f"{name} offset")
        out.tensors.append((name, start, pos))
    out.header_end = pos
    out.data_start = -(-pos // out.alignment) * out.alignment
    return out


def gguf_with_header(raw: bytes, layout: GgufLayout, header: bytes) -> bytes:
    """The file with `header` (the bytes up to the tensor data) in place of its own, the data
    realigned after it (tensor offsets are relative to the data, so they still hold)."""
    pad = -len(header) % layout.alignment
    return header + bytes(pad) + raw[layout.data_start :]


def set_count(header: bytearray, at: int, delta: int) -> None:
    (n,) = struct.unpack_from("<Q", header, at)
    struct.pack_into("<Q", header, at, (n + delta) % 2**64)


def set_gguf_entry(raw: bytes, key: str, vtype: int, v) -> bytes:
    """The GGUF `raw` with metadata `key` set to (value type `vtype`, `v`): replaced where the file
    has it, else added."""
    layout = gguf_layout(raw)
    header = bytearray(raw[: layout.header_end])
    entry = gguf_value(8, key) + struct.pack("<I", vtype) + gguf_value(vtype, v)
    start, end = next(((a, b) for k, a, b in layout.entries if k == key), (None, None))
    if start is None:
        start = end = layout.entries[-1][2]
        set_count(header, 16, +1)
    header[start:end] = entry
    return gguf_with_header(raw, layout, bytes(header))


def typed_value(rng: random.Random) -> tuple[int, object]:
    """A GGUF (value type, value) to put in a metadata entry."""
    kind = rng.choice(["u32", "i32", "u64", "i64", "f32", "f64", "bool", "str", "array", "u8"])
    if kind in ("u32", "u64", "u8"):
        t = {"u32": 4, "u64": 10, "u8": 0}[kind]
        return t, int_field(rng, SCALARS[t], rng.choice([0, 1, 32, 2048]))
    if kind in ("i32", "i64"):
        t = 5 if kind == "i32" else 11
        return t, int_field(rng, SCALARS[t], rng.choice([0, -1, 64]))
    if kind in ("f32", "f64"):
        return (6 if kind == "f32" else 12), rng.choice(FLOATS)
    if kind == "bool":
        return 7, rng.random() < 0.5
    if kind == "str":
        return 8, rng.choice(["", "abc", "llama", "qwen2", "gemma3", "NaN", "1e309", "64"])
    element = rng.choice([4, 5, 6, 7, 8, 9])
    n = rng.choice([0, 1, 2, 3, 16])
    items = {4: lambda: rng.choice([0, 1, 64, 2**31]), 5: lambda: rng.choice([-1, 0, 7]),
             6: lambda: rng.choice(FLOATS), 7: lambda: rng.random() < 0.5,
             8: lambda: rng.choice(["a", "", "blk"]), 9: lambda: (4, [1, 2])}  # fmt: skip
    return 9, (element, [items[element]() for _ in range(n)])


# Keys the tiny GGUF lacks and a damaged (or unusual) one may hold
EXTRA_GGUF_KEYS = ["llama.expert_count", "llama.attention.sliding_window", "llama.vocab_size",
                   "llama.rope.scaling.type", "llama.rope.scaling.factor", "general.alignment",
                   "llama.rope.scale_linear", "llama.rope.scaling.original_context_length",
                   "tokenizer.ggml.padding_token_id", "tokenizer.ggml.unknown_token_id",
                   "llama.attention.head_count_kv", "general.architecture"]  # fmt: skip


def damage_gguf(raw: bytes, rng: random.Random) -> tuple[bytes, str]:
    layout = gguf_layout(raw)
    op = rng.choices(
        ["field", "retype", "drop", "add", "rename", "truncate", "flip", "splice"],
        [35, 15, 8, 8, 8, 10, 10, 6],
    )[0]
    header = bytearray(raw[: layout.header_end])
    if op == "field":
        kinds = sorted({f.kind for f in layout.fields})
        kind = rng.choice(kinds)
        f = rng.choice([f for f in layout.fields if f.kind == kind])
        (old,) = struct.unpack_from(f.fmt, raw, f.at)
        if f.fmt in ("<f", "<d"):
            new = rng.choice(FLOATS)
        elif f.fmt == "<?":
            new = not old
        else:
            new = int_field(rng, f.fmt, old)
        damaged = bytearray(raw)
        struct.pack_into(f.fmt, damaged, f.at, new)
        return bytes(damaged), f"gguf {f.label}: {old!r} -> {new!r}"
    if op in ("retype", "drop"):
        arch_keys = [e for e in layout.entries if e[0].startswith(("llama.", "general.arch"))]
        key, start, end = rng.choice(arch_keys if rng.random() < 0.7 else layout.entries)
        if op == "drop":
            set_count(header, 16, -1)
            new_entry, what = b"", "dropped"
        else:
            vtype, v = typed_value(rng)
            new_entry = gguf_value(8, key) + struct.pack("<I", vtype) + gguf_value(vtype, v)
            what = f"-> type {vtype} {v!r}"[:120]
        header[start:end] = new_entry
        return gguf_with_header(raw, layout, bytes(header)), f"gguf {key} {what}"
    if op == "add":
        key = rng.choice(EXTRA_GGUF_KEYS)
        vtype, v = typed_value(rng)
        at = layout.entries[-1][2]
        header[at:at] = gguf_value(8, key) + struct.pack("<I", vtype) + gguf_value(vtype, v)
        set_count(header, 16, +1)
        return gguf_with_header(raw, layout, bytes(header)), f"gguf added {key}: {v!r}"[:160]
    if op == "rename":
        name, start, end = rng.choice(layout.tensors)
        other = rng.choice(layout.tensors)[0]
        new = rng.choice([
            name.replace("blk.0.", "blk.7."), name.replace("blk.1.", "blk.2."), other,
            name.replace(".weight", ".bias"), name + "x", "blk.0", "blk..bias", "blk.x.y.bias",
            name.replace("blk.0.", "blk.00."), name.replace("blk.1.", "blk.\u00b9."),
        ])  # fmt: skip
        n = len(name.encode())
        header[start : start + 8 + n] = gguf_value(8, new)
        return gguf_with_header(raw, layout, bytes(header)), f"gguf tensor {name} -> {new}"
    if op == "truncate":
        cut = rng.randrange(layout.header_end) if rng.random() < 0.7 else rng.randrange(len(raw))
        return raw[:cut], f"gguf cut at byte {cut} of {len(raw)}"
    if op == "flip":
        damaged = bytearray(raw)
        spots = [rng.randrange(layout.header_end) for _ in range(rng.randint(1, 8))]
        for at in spots:
            damaged[at] ^= 1 << rng.randrange(8)
        return bytes(damaged), f"gguf bits flipped at {spots}"
    at = rng.randrange(layout.header_end)
    n = rng.randint(1, 16)
    if rng.random() < 0.5:
        del header[at : at + n]
        return bytes(header) + raw[layout.header_end :], f"gguf {n} header bytes cut at {at}"
    header[at:at] = header[at : at + n]
    return bytes(header) + raw[layout.header_end :], f"gguf {n} header bytes doubled at {at}"


# ---- safetensors and config.json -----------------------------------------------------------------


def split_safetensors(raw: bytes) -> tuple[dict, bytes]:
    n = int.from_bytes(raw[:8], "little")
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


def join_safetensors(header, data: bytes) -> bytes:
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    return len(text).to_bytes(8, "little") + text + data


def nested(depth: int):
    """A JSON value nested `depth` lists deep (deeper than Python's recursion limit, at will)."""
    return "[" * depth + "]" * depth


def damage_safetensors(folder: Path, rng: random.Random) -> str:
    """Damages one file of the safetensors folder (a copy) in place; returns what it did."""
    files = sorted(folder.glob("*.safetensors"))
    index = folder / "model.safetensors.index.json"
    op = rng.choices(
        ["entry", "entry field gone", "entry replaced", "header replaced", "rename", "drop",
         "length", "truncate", "flip", "nesting", "index"],
        [35, 8, 5, 5, 8, 5, 8, 8, 8, 3, 7 if index.exists() else 0],
    )[0]  # fmt: skip
    path = rng.choice(files)
    raw = path.read_bytes()
    header, data = split_safetensors(raw)
    names = [n for n in header if n != "__metadata__"]
    name = rng.choice(names)
    what = f"{path.name}: "
    if op == "entry":
        key = rng.choice(["dtype", "shape", "data_offsets"])
        old = header[name][key]
        if key == "shape" and rng.random() < 0.5:
            new = rng.choice([[2**32, 2**32], [2**32, 2**32, 2], [2**64 // 2, 4], [-1, 64],
                              [1.5, 64], ["64", 64], [True, 64], [64], [], old[::-1],
                              [old[0] + 1, *old[1:]], [old[0] * 2, *old[1:]],
                              [0, *old[1:]]])  # fmt: skip
        elif key == "data_offsets" and rng.random() < 0.5:
            a, b = old
            new = rng.choice([[str(a), str(b)], [b, a], [a, b + 2], [a - 2, b], [a + 2, b + 2],
                              [-2, b], [a], [a, b, b], [a, 2**64], [float(a), float(b)],
                              [a + len(data), b + len(data)]])  # fmt: skip
        elif key == "dtype" and rng.random() < 0.5:
            new = rng.choice(["F64", "I8", "U8", "f32", "BOOL", "F8_E4M3", None, 4, ["F32"]])
        else:
            new = json_value(rng, old)
        header[name][key] = new
        what += f"{name} {key} {old!r} -> {new!r}"
    elif op == "entry field gone":
        key = rng.choice(["dtype", "shape", "data_offsets"])
        del header[name][key]
        what += f"{name} without {key}"
    elif op == "entry replaced":
        header[name] = rng.choice(JSON_OTHERS + [[64, 64], "F32"])
        what += f"{name} described by {header[name]!r}"
    elif op == "header replaced":
        header = rng.choice([[], "x", 3, None, [header[name]], {"a": [1]}, list(header)])
        what += f"header {json.dumps(header)[:60]}"
    elif op == "rename":
        new = rng.choice([
            name.replace("layers.0.", "layers.5."), name.replace("layers.1.", "layers.9."),
            name.replace("layers.0.", "layers.00."), name + ".x", "model.layers.3.mlp",
            name.replace("weight", "bias"), "model.layers.\u0663.x.weight",  # an Arabic 3
        ])  # fmt: skip
        header[new] = header.pop(name)
        what += f"{name} -> {new}"
    elif op == "drop":
        del header[name]
        what += f"{name} dropped"
    elif op == "length":
        n = int.from_bytes(raw[:8], "little")
        new = rng.choice([0, 1, 2, 7, n - 1, n + 1, len(raw) - 8, len(raw), 2**63, 2**64 - 1,
                          (100 << 20) + 1])  # fmt: skip
        path.write_bytes(new.to_bytes(8, "little") + raw[8:])
        return what + f"header length {n} -> {new}"
    elif op == "truncate":
        cut = rng.randrange(len(raw))
        path.write_bytes(raw[:cut])
        return what + f"cut at byte {cut} of {len(raw)}"
    elif op == "flip":
        n = int.from_bytes(raw[:8], "little")
        damaged = bytearray(raw)
        spots = [8 + rng.randrange(n) for _ in range(rng.randint(1, 6))]
        for at in spots:
            damaged[at] ^= 1 << rng.randrange(8)
        path.write_bytes(bytes(damaged))
        return what + f"header bits flipped at {spots}"
    elif op == "nesting":
        depth = rng.choice([50, 3000, 100_000])
        text = f'{{"{name}": {nested(depth)}}}' if rng.random() < 0.5 else nested(depth)
        path.write_bytes(join_safetensors(text.encode(), data))
        return what + f"header nested {depth} deep"
    else:  # the index of a sharded folder
        table = json.loads(index.read_text())
        shard = rng.choice(list(table["weight_map"]))
        choice = rng.choice(["../../x.safetensors", "/etc/passwd", "missing.safetensors", 5,
                             None, ["a"], "", "..", "sub/model.safetensors"])  # fmt: skip
        if rng.random() < 0.8:
            table["weight_map"][shard] = choice
            what = f"index: {shard} -> {choice!r}"
        else:
            table["weight_map"] = json_value(rng)
            what = f"index: weight_map {table['weight_map']!r}"
        index.write_text(json.dumps(table))
        return what
    path.write_bytes(join_safetensors(header, data))
    return what


# Fields a config.json may hold that the tiny ones do not
EXTRA_CONFIG_KEYS = ["rope_scaling", "rope_parameters", "layer_types", "head_dim",
                     "sliding_window", "use_sliding_window", "max_window_layers",
                     "partial_rotary_factor", "sliding_window_pattern", "hidden_act",
                     "use_bidirectional_attention", "text_config", "attention_bias", "mlp_bias",
                     "pretraining_tp", "num_local_experts", "pad_token_id", "dtype"]  # fmt: skip
ROPE_TYPES = ["default", "linear", "llama3", "yarn", "longrope", "dynamic", "su", 5, None, ""]
ROPE_KEYS = ["factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings",
             "short_factor", "long_factor", "beta_fast", "beta_slow", "attention_factor",
             "mscale", "mscale_all_dim", "truncate", "partial_rotary_factor",
             "rope_theta"]  # fmt: skip


def random_rope(rng: random.Random) -> dict:
    rope = {"rope_type": rng.choice(ROPE_TYPES)}
    for key in rng.sample(ROPE_KEYS, rng.randint(0, 6)):
        if key.endswith("_factor") and key.startswith(("short", "long")):
            n = rng.choice([0, 1, 4, HEAD_DIM // 2, HEAD_DIM // 4, 1000])
            rope[key] = [rng.choice([1.0, 1.0, 2.0, 0.0, -1.0, math.nan]) for _ in range(n)]
        else:
            rope[key] = rng.choice([1.0, 4.0, 8.0, 128, 512, 0.5]) if rng.random() < 0.5 else (
                json_value(rng))  # fmt: skip
    return rope


def damage_config(folder: Path, rng: random.Random) -> str:
    path = folder / "config.json"
    config = json.loads(path.read_text())
    op = rng.choices(["field", "delete", "rope", "model type", "text", "nesting", "top"],
                     [50, 10, 15, 5, 10, 5, 5])[0]  # fmt: skip
    if op == "field":
        keys = list(config)
        key = rng.choice(keys if rng.random() < 0.75 else EXTRA_CONFIG_KEYS)
        old = config.get(key)
        config[key] = json_value(rng, old)
        what = f"config {key}: {old!r} -> {config[key]!r}"
    elif op == "delete":
        key = rng.choice(list(config))
        del config[key]
        what = f"config without {key}"
    elif op == "rope":
        key = rng.choice(["rope_scaling", "rope_parameters"])
        config[key] = random_rope(rng)
        if config["model_type"] == "gemma3_text" and rng.random() < 0.5:
            config[key] = {"full_attention": config[key], "sliding_attention": random_rope(rng)}
        what = f"config {key}: {config[key]!r}"[:200]
    elif op == "model type":
        config["model_type"] = rng.choice([*FOLDER_TYPES, "gemma3", "gpt2", 3, None, ["llama"]])
        what = f"config model_type -> {config['model_type']!r}"
    elif op == "text":
        text = path.read_bytes()
        if rng.random() < 0.5:
            cut = rng.randrange(len(text))
            path.write_bytes(text[:cut])
            return f"config cut at byte {cut} of {len(text)}"
        damaged = bytearray(text)
        spots = [rng.randrange(len(text)) for _ in range(rng.randint(1, 4))]
        for at in spots:
            damaged[at] ^= 1 << rng.randrange(8)
        path.write_bytes(bytes(damaged))
        return f"config bits flipped at {spots}"
    elif op == "nesting":
        depth = rng.choice([20, 400, 3000, 100_000])
        key = rng.choice(["rope_scaling", "extra", "layer_types"])
        text = json.dumps(config)[:-1] + f', "{key}": {nested(depth)}}}'
        path.write_text(text)
        return f"config {key} nested {depth} deep"
    else:
        config = rng.choice([[config], "llama", 3, None, []])
        what = f"config is {json.dumps(config)[:40]}"
    path.write_text(json.dumps(config))
    return what


# ---- the packed cache ----------------------------------------------------------------------------

MAGIC = b"KWKPACK\0"
ALIGN = 4096  # where an entry's data starts (kwker.loading.packed_cache's layout)


def split_entry(raw: bytes) -> tuple[dict, bytes]:
    n = int.from_bytes(raw[8:16], "little")
    return json.loads(raw[16 : 16 + n]), raw[-(-(16 + n) // ALIGN) * ALIGN :]


def join_entry(header, data: bytes) -> bytes:
    text = json.dumps(header).encode()
    start = -(-(16 + len(text)) // ALIGN) * ALIGN
    return MAGIC + len(text).to_bytes(8, "little") + text + bytes(start - 16 - len(text)) + data


def damage_entry(raw: bytes, rng: random.Random) -> tuple[bytes, str]:
    header, data = split_entry(raw)
    op = rng.choices(["header", "weights", "bits", "truncate", "length", "magic", "append"],
                     [40, 10, 20, 10, 10, 5, 5])[0]  # fmt: skip
    if op == "header":
        if rng.random() < 0.3:
            key = rng.choice(["version", "key", "lineage", "data_bytes", "digest", "weights"])
            old = header.get(key)
            header[key] = json_value(rng, old)
            return join_entry(header, data), f"entry {key}: {old!r} -> {header[key]!r}"[:160]
        i = rng.randrange(len(header["weights"]))
        w = header["weights"][i]
        # the storage format half the time where there is one: a flip of it ("Q4" -> "Q5") is
        # the damage that stuck a cache entry (issue 45)
        key = "wtype" if "wtype" in w and rng.random() < 0.5 else rng.choice(sorted(w))
        old = w[key]
        if key == "wtype" and rng.random() < 0.5:
            w[key] = rng.choice(["Q5", "Q8", "F32", "BF16", "F16", "q4", "", "__class__"])
        elif key == "name" and rng.random() < 0.5:
            other = rng.choice(header["weights"])["name"]
            w[key] = rng.choice([other, old.replace("0", "1"), old + "x", "layers.9.q"])
        else:
            w[key] = json_value(rng, old)
        return join_entry(header, data), f"entry weights[{i}].{key}: {old!r} -> {w[key]!r}"
    if op == "weights":
        weights = header["weights"]
        i, j = rng.randrange(len(weights)), rng.randrange(len(weights))
        how = rng.choice(["dropped", "doubled", "swapped"])
        if how == "dropped":
            del weights[i]
        elif how == "doubled":
            weights.insert(i, dict(weights[j]))
        else:
            weights[i], weights[j] = weights[j], weights[i]
        return join_entry(header, data), f"entry weights {how} ({i}, {j})"
    if op == "bits":
        damaged = bytearray(raw)
        spots = [rng.randrange(len(raw)) for _ in range(rng.randint(1, 4))]
        for at in spots:
            damaged[at] ^= 1 << rng.randrange(8)
        return bytes(damaged), f"entry bits flipped at {spots}"
    if op == "truncate":
        cut = rng.randrange(len(raw))
        return raw[:cut], f"entry cut at byte {cut} of {len(raw)}"
    if op == "length":
        old = int.from_bytes(raw[8:16], "little")
        new = int_field(rng, "<Q", old)
        return raw[:8] + new.to_bytes(8, "little") + raw[16:], f"entry header length -> {new}"
    if op == "magic":
        return b"KWKPACX\0" + raw[8:], "entry magic"
    return raw + bytes(rng.randint(1, 5000)), "entry with bytes appended"


# ---- running cases -------------------------------------------------------------------------------


@dataclass
class Outcome:
    kind: str  # refused, loaded, rebuilt, reused; FAILED ... for anything else
    case: str  # what was damaged
    seconds: float
    rss_growth_kb: int  # how far this case raised the process's peak RSS
    detail: str = ""  # the error's message, or the traceback of a failure
    import_accepts_refused: bool = False  # `models import` took a file the load refused

    @property
    def failed(self) -> bool:
        return self.kind.startswith("FAILED")


def peak_rss_kb() -> int:
    """This process's peak RSS in kB: /proc's VmHWM, which starts afresh at exec; ru_maxrss
    does not on Linux (a child of a 9 GB pytest read 9 GB before it did anything)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # kilobytes on Linux


def failure(error: BaseException) -> tuple[str, str]:
    return f"FAILED: {type(error).__name__}", "".join(traceback.format_exception(error))[-3000:]


def run_file_case(path: Path) -> tuple[str, str, bool]:
    """(outcome, detail, import accepts a refused file) of loading the damaged `path`, then of
    checking it as `kwker models import` does: the import must refuse what the load refuses for
    the file's header, and take what loads."""
    try:
        dec = load_files(path, cache=False)
        if dec.max_cache_len > 1:  # a context of 1 (a damaged context_length) holds no answer
            dec.generate([0], max_new_tokens=1)
        kind, detail = "loaded", ""
    except BadModelFile as e:
        kind, detail = "refused", str(e)
    except Exception as e:  # noqa: BLE001  (whatever it is, it is the finding)
        return (*failure(e), False)
    try:
        check_runs(path)
    except BadModelFile as e:
        if kind == "loaded":
            return "FAILED: import refuses a file that loads", str(e), False
        return kind, detail, False
    except Exception as e:  # noqa: BLE001
        kind, detail = failure(e)
        return f"{kind} (import)", detail, False
    return kind, detail, kind == "refused"


def run_cache_case(models: Models, damaged: bytes, scratch: Path) -> tuple[str, str]:
    """Loads the GGUF with its cache entry damaged: the load must succeed and answer as the
    undamaged model does, rebuilding the entry unless the damage did not matter; the next load
    reads the entry back; no debris stays in the cache."""
    cache = scratch / "cache"
    shutil.copytree(models.cache, cache)
    (cache / models.entry).write_bytes(damaged)
    try:
        with cache_dir(cache):
            dec = load_files(models.gguf, 64, precision=PRECISION)
            answer = dec.generate(PROMPT, max_new_tokens=4)[0].tolist()
            kind = "reused" if dec.from_cache else "rebuilt"
            if answer != models.answer:
                return f"FAILED: the {kind} entry answers {answer}", ""
            if not load_files(models.gguf, 64, precision=PRECISION).from_cache:
                return "FAILED: the next load packs again", ""
    except Exception as e:  # noqa: BLE001  (the cache must never fail a load)
        return failure(e)
    debris = [p.name for p in cache.rglob("*") if p.name.endswith(".partial")]
    entries = list((cache / "packed").glob("*.kwk"))
    if debris or len(entries) != 1:
        return f"FAILED: the cache holds {len(entries)} entries and debris {debris}", ""
    return kind, ""


def run_case(models: Models, seed: int, index: int, scratch: Path) -> Outcome:
    """Case `index` of the run seeded `seed`: one damaged copy loaded (see the module doc). Its
    files live in `scratch`, emptied first."""
    rng = random.Random(f"{seed}:{index}")
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    rss, started = peak_rss_kb(), time.perf_counter()
    target = rng.choices(["gguf", "safetensors", "config", "cache"], [35, 25, 25, 15])[0]
    import_accepts = False
    try:
        if target == "gguf":
            damaged, case = damage_gguf(models.gguf.read_bytes(), rng)
            path = scratch / "damaged.gguf"
            path.write_bytes(damaged)
            kind, detail, import_accepts = run_file_case(path)
        elif target == "cache":
            damaged, case = damage_entry((models.cache / models.entry).read_bytes(), rng)
            kind, detail = run_cache_case(models, damaged, scratch)
        else:
            model = rng.choice(sorted(models.folders))
            folder = shutil.copytree(models.folders[model], scratch / model)
            damage = damage_safetensors if target == "safetensors" else damage_config
            case = f"{model}: {damage(folder, rng)}"
            kind, detail, import_accepts = run_file_case(folder)
    except Exception as e:  # noqa: BLE001  (a bug of the fuzzer itself: shown as a failure)
        case, (kind, detail) = f"{target}: damaging failed", failure(e)
    seconds = time.perf_counter() - started
    return Outcome(kind, case[:300], seconds, peak_rss_kb() - rss, detail[:3000], import_accepts)


def run(models: Models, cases: int, seed: int, scratch: Path, progress=None) -> list[Outcome]:
    outcomes = []
    for index in range(cases):
        outcomes.append(run_case(models, seed, index, scratch))
        if progress is not None:
            progress(index, outcomes[-1])
    shutil.rmtree(scratch, ignore_errors=True)
    return outcomes


def counts(outcomes: list[Outcome]) -> dict[str, int]:
    out: dict[str, int] = {}
    for o in outcomes:
        out[o.kind] = out.get(o.kind, 0) + 1
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))
