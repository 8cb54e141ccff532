"""A header that lies is refused before anything is sized by it (issue 45): counts are checked
against the tensor table and against what the native step can take, every field's type is
checked, sizes are multiplied as Python integers, RoPE bases and norm epsilons must be finite and
positive. Each refusal is a BadModelFile naming the file and the field, within a second and a
few MB (a GGUF with llama.block_count = 2^31 took 23-44 s and 16 GB), and `kwker models import`
refuses the same file the same way. The same files, undamaged, load and generate."""

import json
import math
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

import loader_fuzz as lf
import pytest

from kwker.loading.errors import BadModelFile
from kwker.loading.load import load_files
from kwker.models import imported

# GGUF metadata value types (gguf.md)
U32, I32, F32, BOOL, STRING, ARRAY, U64 = 4, 5, 6, 7, 8, 9, 10
SECONDS, GROWTH_MB = 1.0, 64


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KWKER_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def originals(tmp_path_factory):
    """The undamaged tiny models: a llama GGUF, safetensors folders of llama and qwen2."""
    root = tmp_path_factory.mktemp("originals")
    return {
        "gguf": lf.write_gguf(root / "tiny.gguf"),
        "llama": lf.write_folder(root / "llama", "llama"),
        "qwen2": lf.write_folder(root / "qwen2", "qwen2"),
        "sharded": lf.write_folder(root / "sharded", "llama", shards=2),
    }


def refused(path: Path, pattern: str) -> str:
    """The message of the BadModelFile that loading `path` ends in, which must match `pattern`
    and come within SECONDS and GROWTH_MB of peak RSS; `models import` must refuse it alike and
    record nothing."""
    rss, started = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.perf_counter()
    with pytest.raises(BadModelFile, match=pattern) as info:
        load_files(path, cache=False)
    seconds = time.perf_counter() - started
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss) / 1024
    assert seconds < SECONDS and grown_mb < GROWTH_MB, (seconds, grown_mb)
    with pytest.raises(BadModelFile, match=pattern):
        imported.register(path)
    assert imported.entries() == []
    return str(info.value)


def gguf_with(originals, tmp_path, key: str, vtype: int, value) -> Path:
    """A copy of the tiny GGUF with metadata `key` set to `value` of GGUF type `vtype`."""
    path = tmp_path / "lying.gguf"
    path.write_bytes(lf.set_gguf_entry(originals["gguf"].read_bytes(), key, vtype, value))
    return path


REMOVED = object()


def folder_with(originals, tmp_path, model: str = "llama", **fields) -> Path:
    """A copy of a tiny safetensors folder with config.json fields set (REMOVED: removed)."""
    import shutil

    folder = shutil.copytree(originals[model], tmp_path / model)
    config = json.loads((folder / "config.json").read_text())
    for name, value in fields.items():
        if value is REMOVED:
            config.pop(name, None)
        else:
            config[name] = value
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def header_with(originals, tmp_path, edit) -> Path:
    """A copy of the tiny llama folder whose model.safetensors header is edit(header)."""
    folder = folder_with(originals, tmp_path)
    path = folder / "model.safetensors"
    header, data = lf.split_safetensors(path.read_bytes())
    path.write_bytes(lf.join_safetensors(edit(header), data))
    return folder


def test_the_undamaged_files_load_generate_and_import(originals):
    for name, path in originals.items():
        dec = load_files(path, cache=False)
        assert len(dec.generate([0, 1], max_new_tokens=3)[0]) == 5, name
        assert imported.register(path)["path"] == str(path.resolve())


# ---- counts ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key, vtype, value, message",
    [
        ("llama.block_count", U32, 2**31, r"llama\.block_count is 2147483648, more than the 1024"),
        ("llama.block_count", U64, 2**64 - 1, r"llama\.block_count is 18446744073709551615"),
        ("llama.block_count", ARRAY, (U32, [2**31] * 3), r"llama\.block_count is 2147483648"),
        ("llama.block_count", U32, 3, r"num_hidden_layers \(llama\.block_count\) is 3, but the "
         r"tensors hold no layer 2 \(2 layers in all\)"),
        ("llama.block_count", U32, 1, r"llama\.block_count\) is 1, but the tensors hold a layer 1"),
        ("llama.embedding_length", U32, 128, r"token_embd\.weight \(model\.embed_tokens\.weight\) "
         r"has shape \[300, 64\], where the config's \[vocab_size \(llama\.vocab_size\), "
         r"hidden_size \(llama\.embedding_length\)\] make it \[300, 128\]"),
        ("llama.attention.head_count", U32, 8, r"blk\.0\.attn_q\.weight .* has shape \[128, 64\]"
         r", where the config's \[num_attention_heads \(llama\.attention\.head_count\) x "
         r"head_dim \(llama\.attention\.key_length\), hidden_size"),
        ("llama.attention.head_count_kv", U32, 4, r"blk\.0\.attn_k\.weight .*num_key_value_heads"
         r" \(llama\.attention\.head_count_kv\)"),
        ("llama.feed_forward_length", U32, 256, r"blk\.0\.ffn_gate\.weight .* make it \[256, 64\]"),
        ("llama.attention.key_length", U32, 64, r"blk\.0\.attn_q\.weight .*\] make it \[256, 64\]"),
        ("llama.attention.key_length", U32, 16, r"llama\.rope\.dimension_count is 32, more than "
         r"the head size 16"),
        ("llama.vocab_size", U32, 301, r"token_embd\.weight has 300 rows for a vocabulary of 301"),
        ("llama.vocab_size", U32, 2**31, r"llama\.vocab_size is 2147483648, more than the"),
        ("llama.attention.head_count", U32, 0, r"llama\.attention\.head_count is 0, not a posit"),
        ("llama.context_length", U32, 0, r"llama\.context_length is 0, not a positive integer"),
        ("llama.expert_count", U32, 8, r"a mixture-of-experts llama model is not supported"),
    ],
)  # fmt: skip
def test_gguf_counts_that_lie_are_refused(originals, tmp_path, key, vtype, value, message):
    path = gguf_with(originals, tmp_path, key, vtype, value)
    assert refused(path, message).startswith(str(path))


@pytest.mark.parametrize(
    "model, fields, message",
    [
        ("llama", {"num_hidden_layers": 2**31}, r"llama config: num_hidden_layers is 2147483648, "
         r"more than the 1024 kwker's native step takes"),
        ("qwen2", {"num_hidden_layers": 2**31}, r"qwen2 config: num_hidden_layers is 2147483648"),
        ("qwen2", {"num_hidden_layers": 10**400}, r"num_hidden_layers is \d+"),
        ("llama", {"num_hidden_layers": 3}, r"config\.json: num_hidden_layers is 3, but the "
         r"tensors hold no layer 2"),
        ("qwen2", {"num_hidden_layers": 1}, r"num_hidden_layers is 1, but the tensors hold a "
         r"layer 1"),
        ("llama", {"hidden_size": 128}, r"model\.embed_tokens\.weight has shape \[128, 64\], "
         r"where the config's \[vocab_size, hidden_size\] make it \[128, 128\]"),
        ("llama", {"vocab_size": 129}, r"model\.embed_tokens\.weight has shape \[128, 64\]"),
        ("llama", {"num_attention_heads": 8}, r"q_proj\.weight has shape \[64, 64\], where the "
         r"config's \[num_attention_heads x head_dim, hidden_size\] make it \[128, 64\]"),
        ("qwen2", {"num_key_value_heads": 1}, r"k_proj\.weight has shape \[32, 64\], where the "
         r"config's \[num_key_value_heads x head_dim, hidden_size\] make it \[16, 64\]"),
        ("llama", {"intermediate_size": 64}, r"gate_proj\.weight has shape \[128, 64\]"),
        ("llama", {"head_dim": 32}, r"q_proj\.weight has shape \[64, 64\]"),
        ("llama", {"num_key_value_heads": 0}, r"num_key_value_heads is 0, not a positive integer"),
        ("llama", {"vocab_size": 2**40}, r"vocab_size is 1099511627776, more than the 16777216"),
        ("llama", {"max_position_embeddings": 2**63}, r"max_position_embeddings is 922"),
    ],
)  # fmt: skip
def test_config_counts_that_lie_are_refused(originals, tmp_path, model, fields, message):
    refused(folder_with(originals, tmp_path, model, **fields), message)


def test_a_huge_layer_count_is_refused_in_a_capped_address_space(originals):
    """The issue's two reproductions, in a process allowed 512 MB more than it maps: no memory is
    sized by the count before it is refused (16 GB would be a MemoryError here)."""
    code = f"""
import resource, sys, time, json, shutil, tempfile
from pathlib import Path
sys.path[:0] = {[str(Path(__file__).parent), str(Path(__file__).parents[1])]!r}
import loader_fuzz as lf
from kwker.loading.errors import BadModelFile
from kwker.loading.load import load_files
tmp = Path(tempfile.mkdtemp())
gguf = tmp / "lying.gguf"
gguf.write_bytes(lf.set_gguf_entry(Path({str(originals["gguf"])!r}).read_bytes(),
                                   "llama.block_count", 4, 2**31))
folder = shutil.copytree({str(originals["qwen2"])!r}, tmp / "qwen2")
config = json.loads((folder / "config.json").read_text())
config["num_hidden_layers"] = 2**31
(folder / "config.json").write_text(json.dumps(config))
status = dict(line.split(":", 1) for line in open("/proc/self/status"))
mapped = int(status["VmSize"].split()[0]) << 10
resource.setrlimit(resource.RLIMIT_AS, (mapped + (512 << 20), resource.RLIM_INFINITY))
for path in (gguf, folder):
    started = time.perf_counter()
    try:
        load_files(path, cache=False)
    except BadModelFile as e:
        print(f"{{time.perf_counter() - started:.3f}}", e)
shutil.rmtree(tmp)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert len(lines) == 2, done.stdout
    assert "llama.block_count is 2147483648" in lines[0]
    assert "num_hidden_layers is 2147483648" in lines[1]
    assert all(float(line.split()[0]) < SECONDS for line in lines)


# ---- types ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "vtype, value, shown",
    [(F32, 2.0, "2.0"), (BOOL, True, "True"), (STRING, "2", "'2'"), (I32, -2, "-2"),
     (ARRAY, (STRING, ["2", "2"]), "'2'"), (ARRAY, (U32, [2, 3]), None)],
)  # fmt: skip
def test_a_gguf_count_of_another_type_is_refused(originals, tmp_path, vtype, value, shown):
    path = gguf_with(originals, tmp_path, "llama.block_count", vtype, value)
    if shown is None:  # per-layer values that differ
        refused(path, r"llama\.block_count differs between layers \(\[2, 3\]\)")
    else:
        refused(path, rf"llama\.block_count is {shown}, not a positive integer")


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"num_hidden_layers": True}, r"num_hidden_layers is True, not a positive integer"),
        ({"num_hidden_layers": 2.0}, r"num_hidden_layers is 2\.0, not a positive integer"),
        ({"num_hidden_layers": "2"}, r"num_hidden_layers is '2', not a positive integer"),
        ({"num_hidden_layers": [2]}, r"num_hidden_layers is \[2\], not a positive integer"),
        ({"num_hidden_layers": None}, r"num_hidden_layers is None, not a positive integer"),
        # absent: the class's default, 32 layers, which the tensor table then refutes
        ({"num_hidden_layers": REMOVED}, r"config\.json: num_hidden_layers is 32, but the "
         r"tensors hold no layer 2"),
        ({"hidden_size": {"a": 64}}, r"hidden_size is \{'a': 64\}, not a positive integer"),
        ({"tie_word_embeddings": "yes"}, r"tie_word_embeddings is 'yes', not true or false"),
        ({"eos_token_id": "2"}, r"eos_token_id is '2', not an integer >= 0"),
        ({"eos_token_id": [2, -1]}, r"eos_token_id is -1, not an integer >= 0"),
        ({"rope_scaling": "llama3"}, r"rope_scaling is 'llama3', not an object"),
        ({"rope_scaling": {"rope_type": ["llama3"], "factor": 2.0}},
         r"rope_parameters: rope_type is \['llama3'\], not a string"),
        ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}},
         r"rope_parameters has no low_freq_factor, which rope type 'llama3' needs"),
        ({"hidden_act": ["silu"]}, r"hidden_act is \['silu'\], not a string"),
        ({"model_type": ["llama"]}, r"model type \['llama'\] is not supported"),
    ],
)  # fmt: skip
def test_a_config_field_of_another_type_is_refused(originals, tmp_path, fields, message):
    message = refused(folder_with(originals, tmp_path, **fields), message)
    assert "config.json" in message


@pytest.mark.parametrize(
    "layer_types, message",
    [(["full_attention", 3], r"layer_types is \['full_attention', 3\], not a list of strings"),
     (["linear_attention", "full_attention"], r"layer_types\[0\] is 'linear_attention' "
      r"\(supported: full_attention, sliding_attention\)"),
     ("full_attention", r"layer_types is 'full_attention', not a list of strings")],
)  # fmt: skip
def test_layer_types_are_a_list_of_known_types(originals, tmp_path, layer_types, message):
    refused(folder_with(originals, tmp_path, "qwen2", layer_types=layer_types), message)


@pytest.mark.parametrize("depth", [200, 100_000])
def test_a_config_nested_too_deeply_is_refused(originals, tmp_path, depth):
    folder = folder_with(originals, tmp_path)
    text = (folder / "config.json").read_text()[:-1] + f', "extra": {"[" * depth + "]" * depth}}}'
    (folder / "config.json").write_text(text)
    refused(folder, r"config\.json: .*(nests objects or lists more than 16 deep|recursion)")


def test_a_config_that_is_not_an_object_is_refused(originals, tmp_path):
    folder = folder_with(originals, tmp_path)
    (folder / "config.json").write_text("[1, 2]")
    refused(folder, r"config\.json: the config is \[1, 2\], not a JSON object")


# ---- safetensors headers -------------------------------------------------------------------

Q = "model.layers.0.self_attn.q_proj.weight"


def entry(header, **changes):
    """The header with tensor Q's entry changed (a value of None: the field removed)."""
    for key, value in changes.items():
        if value is None:
            del header[Q][key]
        else:
            header[Q][key] = value
    return header


def renamed(header, name: str):
    """The header with tensor Q under another name."""
    header[name] = header.pop(Q)
    return header


@pytest.mark.parametrize(
    "edit, message",
    [
        # an int64 product wraps to 0, which no bytes matched before
        (lambda h: entry(h, shape=[2**32, 2**32], data_offsets=[0, 0]),
         r"q_proj\.weight has 0 bytes, its shape takes 36893488147419103232"),
        (lambda h: entry(h, shape=None), r"q_proj\.weight has shape None, not a list of integers"),
        (lambda h: list(h.values()), r"model\.safetensors: the header is list, not a JSON object"),
        (lambda h: "F32", r"the header is str, not a JSON object"),
        (lambda h: entry(h, data_offsets=[str(x) for x in h[Q]["data_offsets"]]),
         r"q_proj\.weight has data_offsets \['\d+', '\d+'\], not two integers >= 0"),
        (lambda h: entry(h, shape=[64.0, 64]), r"has shape \[64\.0, 64\], not a list of integers"),
        (lambda h: entry(h, shape=[True, 64]), r"has shape \[True, 64\], not a list of integers"),
        (lambda h: entry(h, shape=[-64, -64]), r"has shape \[-64, -64\], not a list of integers"),
        (lambda h: entry(h, dtype=None), r"q_proj\.weight has dtype None, not F32/F16/BF16"),
        (lambda h: entry(h, dtype=["BF16"]), r"has dtype \['BF16'\], not F32/F16/BF16"),
        (lambda h: entry(h, data_offsets=None), r"has data_offsets None, not two integers"),
        (lambda h: entry(h, data_offsets=[0]), r"has data_offsets \[0\], not two integers"),
        (lambda h: {**h, Q: "F32"}, r"q_proj\.weight is described by 'F32', not an object"),
        (lambda h: entry(h, shape=[64, 63]), r"q_proj\.weight has 8192 bytes, its shape takes "
         r"8064"),
        (lambda h: renamed(h, "model.layers.0.mlp.extra.weight"),
         r"model\.layers\.0\.mlp\.extra\.weight are not part of a llama model"),
    ],
)  # fmt: skip
def test_a_safetensors_header_that_lies_is_refused(originals, tmp_path, edit, message):
    message = refused(header_with(originals, tmp_path, edit), message)
    assert "model.safetensors" in message or "llama" in message


def test_a_header_nested_too_deeply_is_refused(originals, tmp_path):
    folder = header_with(originals, tmp_path, lambda h: h)
    path = folder / "model.safetensors"
    _, data = lf.split_safetensors(path.read_bytes())
    path.write_bytes(lf.join_safetensors(lf.nested(100_000).encode(), data))
    refused(folder, r"model\.safetensors: the header is not JSON")


@pytest.mark.parametrize("name", ["../model.safetensors", "/etc/passwd", 5, "sub/x.safetensors"])
def test_an_index_names_only_files_in_its_folder(originals, tmp_path, name):
    import shutil

    folder = shutil.copytree(originals["sharded"], tmp_path / "sharded")
    index = folder / "model.safetensors.index.json"
    table = json.loads(index.read_text())
    table["weight_map"][Q] = name
    index.write_text(json.dumps(table))
    refused(folder, r"model\.safetensors\.index\.json: weight_map names .* not the name of a file")


# ---- RoPE bases and norms -------------------------------------------------------------------


@pytest.mark.parametrize("value", [-1.0, math.inf, math.nan, 0.0])
@pytest.mark.parametrize("key", ["llama.rope.freq_base", "llama.attention.layer_norm_rms_epsilon"])
def test_a_gguf_rope_base_or_norm_epsilon_must_be_finite_and_positive(
    originals, tmp_path, key, value
):
    path = gguf_with(originals, tmp_path, key, F32, value)
    refused(path, rf"{re.escape(key)} is {value}, not a finite number > 0")


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"rope_theta": -1}, r"rope_parameters: rope_theta is -1, not a finite number > 0"),
        ({"rope_theta": math.inf}, r"rope_theta is inf, not a finite number > 0"),
        ({"rope_theta": math.nan}, r"rope_theta is nan, not a finite number > 0"),
        ({"rope_theta": "1e4"}, r"rope_theta is '1e4', not a finite number > 0"),
        ({"rms_norm_eps": 0}, r"rms_norm_eps is 0, not a finite number > 0"),
        ({"rms_norm_eps": -1e-6}, r"rms_norm_eps is -1e-06, not a finite number > 0"),
        ({"rms_norm_eps": math.nan}, r"rms_norm_eps is nan, not a finite number > 0"),
        ({"rms_norm_eps": 10**400}, r"rms_norm_eps is \d+.*, not a finite number > 0"),
        ({"rope_scaling": {"rope_type": "linear", "factor": -2.0}},
         r"rope_parameters: factor is -2\.0, not a finite number > 0"),
        ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0,
                           "high_freq_factor": 1.0, "original_max_position_embeddings": 128}},
         r"low_freq_factor is not below high_freq_factor"),
        ({"rms_norm_eps": 1e300}, r"norm_eps = 1e\+300 \(from the config's rms_norm_eps\) is "
         r"past the float32 range"),
        ({"partial_rotary_factor": 1e-45}, r"a partial_rotary_factor of 1e-45 rotates 0 of the "
         r"head's 16 dimensions"),
        # each value valid, the combination not: yarn divides by the log of the base
        ({"rope_theta": 1.0, "rope_scaling": {"rope_type": "yarn", "factor": 2.0,
                                              "original_max_position_embeddings": 128}},
         r"cannot be tabulated \(ZeroDivisionError"),
        # finite and positive, but so small that float32 RoPE overflows: caught on the tables
        ({"rope_theta": 1e-300, "rope_scaling": None},
         r"the RoPE parameters .* give rotations that are not finite numbers"),
    ],
)  # fmt: skip
def test_a_config_rope_base_or_norm_epsilon_must_be_finite_and_positive(
    originals, tmp_path, fields, message
):
    refused(folder_with(originals, tmp_path, **fields), message)


def test_a_valid_rope_base_still_loads(originals, tmp_path):
    folder = folder_with(originals, tmp_path, rope_theta=500000, rms_norm_eps=1e-5)
    assert len(load_files(folder, cache=False).generate([0], max_new_tokens=2)[0]) == 3
