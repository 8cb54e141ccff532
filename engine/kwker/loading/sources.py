"""Where a model's tensors come from: a Hugging Face model object, safetensors files, or a GGUF
file.

Every source answers in the same terms, so one loader (kwker.loading.build) packs all three:
`names` is the set of tensors it holds, under their Hugging Face state-dict names
(`model.layers.0.self_attn.q_proj.weight`), `shape(name)` its shape, and `tensor(name)` is a
`RawTensor`: the bytes of its rows as the source stores them (ggml type ids name the storage, F32 /
F16 / BF16 included), never a float copy. The native loader dequantizes and packs a panel of rows
at a time from those bytes, so loading costs the packed weights plus a few rows of scratch,
whatever the source's format.

File sources map their files (MappedFile); `release(name)` drops a tensor's pages from this
process once it is packed, so a file bigger than memory streams through.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import reprlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kwker import _native
from kwker.loading.errors import BadModelFile

GGML_TYPE = {name: tid for tid, (name, _, _) in _native.ggml_types.items()}


@dataclass
class RawTensor:
    raw: np.ndarray  # uint8 [rows * row bytes]: the rows as the source stores them
    ggml_type: int
    shape: tuple[int, ...]  # Hugging Face order: (rows, columns) for a matrix
    # rows of a matrix that the source keeps permuted: row r is stored at row_order[r]
    row_order: np.ndarray | None = None
    offset: float = 0.0  # added to every value: a GGUF's Gemma norms are stored as 1 + w

    @property
    def type_name(self) -> str:
        return _native.ggml_types[self.ggml_type][0]

    def float32(self) -> np.ndarray:
        """The values as float32, in Hugging Face order (for the small tensors: norms, biases)."""
        k = self.shape[-1]
        rows = math.prod(self.shape[:-1])
        values = _native.ggml_dequantize(self.raw, self.ggml_type, rows, k).reshape(self.shape)
        if self.row_order is not None:
            values = values[self.row_order]
        if self.offset:
            values = values + np.float32(self.offset)  # float32, as transformers subtracts it
        return values


def torch_storage_type(dtype) -> str | None:
    """The ggml name of a torch dtype's storage (F32, F16, BF16); None for one kwker cannot read."""
    import torch

    return {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16"}.get(dtype)


class TorchSource:
    """The tensors of a Hugging Face model object (its state dict; a tied lm_head is left out, as a
    file leaves it out)."""

    def __init__(self, model):
        state = model.state_dict()
        head = getattr(model, "lm_head", None)
        embed = model.get_input_embeddings()
        if head is not None and head.weight.data_ptr() == embed.weight.data_ptr():
            state.pop("lm_head.weight", None)
        self._state = {k: v for k, v in state.items() if not k.endswith("rotary_emb.inv_freq")}
        self.names = set(self._state)
        self.description = type(model).__name__

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._state[name].shape)

    def tensor(self, name: str) -> RawTensor:
        import torch

        t = self._state[name].detach()
        storage = torch_storage_type(t.dtype)
        if storage is None:
            raise BadModelFile(f"{name}: weights of dtype {t.dtype} are not supported")
        raw = t.contiguous().reshape(-1).view(torch.uint8).numpy()  # the storage's own bytes
        return RawTensor(raw, GGML_TYPE[storage], tuple(t.shape))

    def type_name(self, name: str) -> str | None:
        return torch_storage_type(self._state[name].dtype)

    def release(self, name: str) -> None:
        pass


# safetensors dtypes the loader reads: the float types a checkpoint keeps its weights in
SAFETENSORS_TYPES = {"F32": ("F32", 4), "F16": ("F16", 2), "BF16": ("BF16", 2)}


class SafetensorsSource:
    """A model's safetensors files: one `model.safetensors`, or the shards a
    `model.safetensors.index.json` lists. The header of each file is read here (8 bytes of length,
    then JSON: the format's whole specification) because the safetensors package's numpy reader
    cannot return bfloat16, the dtype most checkpoints use, and its torch reader would need
    torch."""

    def __init__(self, folder: Path):
        folder = Path(folder)
        index = folder / "model.safetensors.index.json"
        if index.exists():
            files = sorted({folder / f for f in shard_names(index)})
        elif (folder / "model.safetensors").exists():
            files = [folder / "model.safetensors"]
        else:
            raise BadModelFile(f"{folder} has no model.safetensors or model.safetensors.index.json")
        self.files = files
        self.description = str(folder)
        self._where: dict[str, tuple[MappedFile | None, int, int, str, tuple[int, ...]]] = {}
        for path in files:
            self._read_header(path)
        self.names = set(self._where)

    def _read_header(self, path: Path) -> None:
        if not path.exists():
            raise BadModelFile(f"{path}: missing (the index names it)")
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise BadModelFile(f"{path}: too short for a safetensors header")
            n = int.from_bytes(head, "little")
            if n > size - 8 or n > 100 << 20:
                raise BadModelFile(f"{path}: header of {n} bytes does not fit the file")
            try:
                header = json.loads(f.read(n))
            except (ValueError, RecursionError) as e:  # RecursionError: nested too deeply
                raise BadModelFile(f"{path}: the header is not JSON ({e})") from None
        if not isinstance(header, dict):
            raise BadModelFile(f"{path}: the header is {type(header).__name__}, not a JSON object")
        data = MappedFile(path) if size > 8 + n else None  # None: a file without tensor data
        start, spans = 8 + n, []
        for name, info in header.items():
            if name == "__metadata__":
                continue
            if name in self._where:
                raise BadModelFile(f"{path}: tensor {name} is also in another file")
            dtype, shape, (a, b) = tensor_entry(path, name, info)
            if start + b > size:
                raise BadModelFile(
                    f"{path}: tensor {name} ends at byte {start + b}, past the end of the file "
                    f"({size} bytes): the file is truncated"
                )
            spans.append((a, b, name))
            self._where[name] = (data, start + a, start + b, dtype, shape)
        spans.sort()
        for (_, b0, n0), (a1, _, n1) in zip(spans, spans[1:], strict=False):
            if a1 < b0:
                raise BadModelFile(f"{path}: tensors {n0} and {n1} overlap")

    def shape(self, name: str) -> tuple[int, ...]:
        return self._where[name][4]

    def type_name(self, name: str) -> str:
        return SAFETENSORS_TYPES[self._where[name][3]][0]

    def tensor(self, name: str) -> RawTensor:
        data, a, b, dtype, shape = self._where[name]
        raw = data.view(a, b) if b > a else np.zeros(0, np.uint8)
        return RawTensor(raw, GGML_TYPE[SAFETENSORS_TYPES[dtype][0]], shape)

    def release(self, name: str) -> None:
        data, a, b, _, _ = self._where[name]
        if data is not None:
            data.drop(a, b)


def shard_names(index: Path) -> set[str]:
    """The file names a model.safetensors.index.json's weight_map lists: plain names of files in
    its folder (a path elsewhere would make the loader read any file the index names)."""
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
    except (ValueError, KeyError, TypeError, RecursionError) as e:
        raise BadModelFile(f"{index}: not a safetensors index ({e})") from None
    if not isinstance(weight_map, dict):
        raise BadModelFile(f"{index}: weight_map is not a JSON object")
    names = set()
    for tensor, name in weight_map.items():
        if not isinstance(name, str) or Path(name).name != name or name in ("", ".", ".."):
            raise BadModelFile(
                f"{index}: weight_map names {reprlib.repr(name)} for tensor {tensor}, not the name "
                "of a file in its folder"
            )
        names.add(name)
    return names


def tensor_entry(path: Path, name: str, info) -> tuple[str, tuple[int, ...], tuple[int, int]]:
    """(dtype, shape, (begin, end)) of one tensor of a safetensors header, every field checked
    for its type: a header is the file's word on how much to read and where, so a lie in it must
    be refused here, before any size is computed from it. Sizes are Python integers: a shape
    whose product wraps around in 64 bits (2^32 x 2^32) is as large as it says, not 0."""
    if not isinstance(info, dict):
        raise BadModelFile(
            f"{path}: tensor {name} is described by {reprlib.repr(info)}, not an object"
        )
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in SAFETENSORS_TYPES:
        raise BadModelFile(
            f"{path}: tensor {name} has dtype {reprlib.repr(dtype)}, not F32/F16/BF16"
        )
    if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
        raise BadModelFile(
            f"{path}: tensor {name} has shape {reprlib.repr(shape)}, not a list of integers >= 0"
        )
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_count(x) for x in offsets):
        raise BadModelFile(
            f"{path}: tensor {name} has data_offsets {reprlib.repr(offsets)}, not two integers >= 0"
        )
    a, b = offsets
    want = math.prod(shape) * SAFETENSORS_TYPES[dtype][1]
    if b - a != want:
        raise BadModelFile(f"{path}: tensor {name} has {b - a} bytes, its shape takes {want}")
    return dtype, tuple(shape), (a, b)


def _is_count(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


class MappedFile:
    """A file mapped read-only: byte ranges as uint8 arrays (views, no copy), and `drop` to let
    go of a range's pages once read. This process should hold the packed weights, not the file
    they came from; the page cache keeps the pages, so nothing is read twice."""

    def __init__(self, path):
        with open(path, "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self._bytes = np.frombuffer(self._map, np.uint8)  # read-only, as the mapping is

    def view(self, a: int, b: int) -> np.ndarray:
        return self._bytes[a:b]

    def drop(self, a: int, b: int) -> None:
        """Drops bytes [a, b) (the whole pages they touch) from this process's memory."""
        page = mmap.PAGESIZE
        start, stop = a // page * page, min(-(-b // page) * page, len(self._map))
        if stop > start and hasattr(self._map, "madvise"):  # madvise: Python 3.8+ on Unix
            self._map.madvise(mmap.MADV_DONTNEED, start, stop - start)


def file_identity(paths) -> list[list]:
    """What a packed-weights cache entry keys its source on: each file's resolved path, size and
    modification time (a changed file is a new source)."""
    out = []
    for p in paths:
        st = os.stat(p)
        out.append([str(Path(p).resolve()), st.st_size, st.st_mtime_ns])
    return out


# GGUF tensor names (llama.cpp's) -> Hugging Face state-dict names, for the architectures the
# families run; {i} is the layer. Gemma 3 names its four norms differently from Llama's two.
GGUF_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output.weight": "lm_head.weight",
    "output_norm.weight": "model.norm.weight",
}
GGUF_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "attn_norm": "input_layernorm",
}
GGUF_NORMS = {
    "gemma3": {
        "post_attention_norm": "post_attention_layernorm",
        "ffn_norm": "pre_feedforward_layernorm",
        "post_ffw_norm": "post_feedforward_layernorm",
    },
}
GGUF_DEFAULT_NORMS = {"ffn_norm": "post_attention_layernorm"}
# Architectures whose converter (llama.cpp's convert_hf_to_gguf.py) permutes the rows of attn_q
# and attn_k for its rope kernel, and those whose norms it stores as 1 + w.
GGUF_PERMUTED_QK = {"llama"}
GGUF_NORM_PLUS_ONE = {"gemma3"}


def hf_name(arch: str, gguf_name: str) -> str | None:
    """The Hugging Face name of a GGUF tensor (None: a name this architecture does not use)."""
    if gguf_name in GGUF_NAMES:
        return GGUF_NAMES[gguf_name]
    parts = gguf_name.split(".")
    if len(parts) != 4 or parts[0] != "blk" or not parts[1].isdigit():
        return None
    _, layer, leaf, kind = parts
    target = GGUF_LAYER_NAMES.get(leaf) or GGUF_NORMS.get(arch, GGUF_DEFAULT_NORMS).get(leaf)
    if target is None or kind not in ("weight", "bias"):
        return None
    return f"model.layers.{layer}.{target}.{kind}"


class GgufSource:
    """The tensors of a GGUF file (read by kwker.loading.gguf_file), under Hugging Face names,
    with llama.cpp's conversions undone as transformers undoes them: the row permutation of
    Llama's attn_q / attn_k (a row order, so the blocks are read as they are) and Gemma's 1 + w
    norms (an offset of -1 on the float32 values). A split model's tensors are in several files
    (kwker.loading.gguf_split; each TensorInfo names its own); a file is mapped when a tensor's
    bytes are first read, so a header alone (one read from the Hub) answers the rest."""

    # tensors a GGUF may hold that no family reads from it (their content is configuration the
    # loader checks elsewhere)
    EXTRA = {"rope_freqs.weight"}

    def __init__(self, gguf, config):
        self.file = gguf
        self.description = str(gguf.path)
        self.arch = gguf.metadata.get("general.architecture")
        self._config = config
        self._names: dict[str, str] = {}
        self._maps: dict[Path, MappedFile] = {}
        unknown = []
        for name in gguf.tensors:
            if name in self.EXTRA:
                continue
            target = hf_name(self.arch, name)
            if target is None:
                unknown.append(name)
            else:
                self._names[target] = name
        if unknown:
            raise BadModelFile(
                f"{gguf.path}: tensors {', '.join(unknown[:5])}"
                f"{' ...' if len(unknown) > 5 else ''} are not part of a {self.arch} model"
            )
        self.names = set(self._names)

    def _data(self, info) -> MappedFile:
        path = info.path or self.file.path
        if path not in self._maps:
            self._maps[path] = MappedFile(path)
        return self._maps[path]

    def gguf_name(self, name: str) -> str:
        return self._names[name]

    def shape(self, name: str) -> tuple[int, ...]:
        return self.file.tensors[self._names[name]].shape

    def type_name(self, name: str) -> str:
        from kwker.loading.gguf_file import type_name

        return type_name(self.file.tensors[self._names[name]].ggml_type)

    def tensor(self, name: str) -> RawTensor:
        info = self.file.tensors[self._names[name]]
        raw = self._data(info).view(info.offset, info.offset + info.nbytes)
        order = None
        if self.arch in GGUF_PERMUTED_QK and (".q_proj." in name or ".k_proj." in name):
            c = self._config
            heads = c.num_attention_heads if ".q_proj." in name else c.num_key_value_heads
            order = llama_cpp_row_order(info.shape[0], heads)
        offset = -1.0 if self.arch in GGUF_NORM_PLUS_ONE and name.endswith("norm.weight") else 0.0
        return RawTensor(raw, info.ggml_type, tuple(info.shape), order, offset)

    def release(self, name: str) -> None:
        info = self.file.tensors[self._names[name]]
        self._data(info).drop(info.offset, info.offset + info.nbytes)


def llama_cpp_row_order(rows: int, heads: int) -> np.ndarray:
    """For each Hugging Face row of a q / k projection, the row llama.cpp's converter moved it to.
    Within a head of d rows it interleaves the two rotary halves: HF row (half, i) is row 2 i + half
    (convert_hf_to_gguf.py's `permute`; transformers' `_reverse_permute_weights` undoes it)."""
    d = rows // heads
    h, half, i = np.meshgrid(np.arange(heads), np.arange(2), np.arange(d // 2), indexing="ij")
    return (h * d + 2 * i + half).reshape(-1).astype(np.int32)
