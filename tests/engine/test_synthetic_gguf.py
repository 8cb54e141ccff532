"""tests/synthetic_gguf.py writes GGUF files that independent readers accept: the gguf package's
reader and reference dequantizers, transformers (model and tokenizer) and, where installed,
llama.cpp. Tiny shapes only; the 8B preset is checked as a plan (names, shapes, sizes) unwritten."""

import math

import gguf
import numpy as np
import pytest
import synthetic_gguf as sg
import torch
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize

from kwker.llama_cpp_amx import cpu_has_amx, keep_llama_cpp_off_amx

QUANT_TYPES = list(sg.SCALE_FIELDS)


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory):
    """One tiny file per matrix type, written once for the module."""
    folder = tmp_path_factory.mktemp("synthetic")
    return {t: sg.write_gguf(folder / f"tiny-{t}.gguf", "tiny", t) for t in sg.MATRIX_TYPES}


def field(reader, key):
    return reader.fields[key].contents()


@pytest.mark.parametrize("qtype", QUANT_TYPES, ids=lambda q: q.name)
def test_scale_fields_are_every_float_the_dequantizer_reads(qtype):
    # With the fields SCALE_FIELDS names set to zero, the reference decoder must give exactly zero:
    # every value is a product with one of them, so a mislocated field would leave random fp16 bits
    # (and NaNs) in the output.
    blocks = sg.random_blocks(np.random.default_rng(1), qtype, 512)
    assert blocks.shape == (512, gguf.GGML_QUANT_SIZES[qtype][1])
    values = dequantize(blocks, qtype)
    assert values.shape == (512, gguf.GGML_QUANT_SIZES[qtype][0])
    assert np.isfinite(values).all() and 0 < np.abs(values).max() < 1
    zeroed = blocks.copy()
    for offset in sg.SCALE_FIELDS[qtype]:
        zeroed[:, offset : offset + 2] = 0
    assert not np.any(dequantize(zeroed, qtype))


@pytest.mark.parametrize("matrix_type", sg.MATRIX_TYPES)
def test_every_tensor_dequantizes_to_sane_values(tiny_files, matrix_type):
    reader = gguf.GGUFReader(tiny_files[matrix_type])
    assert len(reader.tensors) == len(sg.tensor_plan(sg.SHAPES["tiny"], matrix_type))
    for t in reader.tensors:
        values = dequantize(t.data, t.tensor_type)
        assert np.isfinite(values).all(), t.name
        assert np.abs(values).max() < 10, t.name
        if t.name.endswith(("_norm.weight", "rope_freqs.weight")):
            assert values.min() > 0, t.name
        else:  # random weights, not a constant: about a real checkpoint's spread
            assert 0.005 < values.std() < 0.1, t.name


@pytest.mark.parametrize("matrix_type", ["Q4_K", "Q4_K_M", "F16", "Q5_1"])
def test_tensor_names_shapes_and_types_are_as_planned(tiny_files, matrix_type):
    reader = gguf.GGUFReader(tiny_files[matrix_type])
    plan = sg.tensor_plan(sg.SHAPES["tiny"], matrix_type)
    got = [
        (t.name, tuple(int(n) for n in t.shape), t.tensor_type, int(t.n_bytes))
        for t in reader.tensors
    ]
    assert got == [(s.name, s.ne, s.qtype, s.nbytes) for s in plan]
    by_name = {s.name: s for s in plan}
    # GGUF's shapes put the row (the input dimension) first: attn_k maps hidden 256 to 2 kv heads of
    # 32
    assert by_name["blk.1.attn_k.weight"].ne == (256, 64)
    assert by_name["blk.1.attn_output.weight"].ne == (256, 256)
    assert by_name["blk.0.ffn_down.weight"].ne == (512, 256)
    assert by_name["token_embd.weight"].ne == by_name["output.weight"].ne == (256, 1024)
    assert by_name["rope_freqs.weight"].ne == (16,)


def test_q4_k_m_mix():
    plan = {s.name: s.qtype for s in sg.tensor_plan(sg.SHAPES["tiny"], "Q4_K_M")}
    six = {n for n, q in plan.items() if q == Q.Q6_K}
    assert six == {"output.weight"} | {
        f"blk.{i}.{m}.weight" for i in (0, 1) for m in ("attn_v", "ffn_down")
    }
    assert plan["token_embd.weight"] == plan["blk.0.attn_q.weight"] == Q.Q4_K
    assert plan["blk.0.attn_norm.weight"] == Q.F32


def test_llama_8b_plan():
    plan = sg.tensor_plan(sg.SHAPES["llama-3.1-8b"], "Q4_K")
    assert len(plan) == 1 + 1 + 32 * 9 + 2
    by_name = {s.name: s for s in plan}
    assert by_name["blk.31.attn_q.weight"].ne == (4096, 4096)
    assert by_name["blk.31.attn_v.weight"].ne == (4096, 1024)
    assert by_name["blk.0.ffn_up.weight"].ne == (4096, 14336)
    assert by_name["blk.0.ffn_down.weight"].ne == (14336, 4096)
    assert by_name["output.weight"].ne == (4096, 128256)
    params = sum(math.prod(s.shape) for s in plan if s.kind != "rope_freqs")
    assert params == 8_030_261_248  # Llama-3.1-8B's parameter count
    matrices = sum(math.prod(s.shape) for s in plan if s.kind == "matrix")
    f32 = sum(s.nbytes for s in plan if s.qtype == Q.F32)
    assert sum(s.nbytes for s in plan) == matrices // 256 * 144 + f32  # 4.5 bits a weight
    assert len(sg.tensor_plan(sg.resolve_shape("llama-3.1-8b", layers=4), "Q4_0")) == 4 + 4 * 9


def test_metadata(tiny_files):
    reader = gguf.GGUFReader(tiny_files["Q4_K"])
    expected = {
        "general.architecture": "llama",
        "llama.block_count": 2,
        "llama.context_length": 2048,
        "llama.embedding_length": 256,
        "llama.feed_forward_length": 512,
        "llama.attention.head_count": 8,
        "llama.attention.head_count_kv": 2,
        "llama.attention.key_length": 32,
        "llama.attention.value_length": 32,
        "llama.rope.freq_base": 500000.0,
        "llama.rope.dimension_count": 32,
        "llama.vocab_size": 1024,
        "general.file_type": int(gguf.LlamaFileType.MOSTLY_Q4_K_S),
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "llama-bpe",
        "tokenizer.ggml.bos_token_id": 1024 - 16,
        "tokenizer.ggml.eos_token_id": 1024 - 16 + 9,
    }
    assert {k: field(reader, k) for k in expected} == expected
    assert field(reader, "llama.attention.layer_norm_rms_epsilon") == pytest.approx(1e-5)
    tokens = field(reader, "tokenizer.ggml.tokens")
    types = field(reader, "tokenizer.ggml.token_type")
    assert len(tokens) == len(set(tokens)) == len(types) == 1024
    assert tokens[1008] == "<|begin_of_text|>" and tokens[1017] == "<|eot_id|>" and types[1017] == 3
    assert set(types[:1008]) == {1} and set(types[1008:]) == {3}
    for merge in field(reader, "tokenizer.ggml.merges"):
        a, b = merge.split(" ")
        assert {a, b, a + b} <= set(tokens[:1008])


def test_rope_freqs_are_transformers_llama3_scaling():
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    shape = sg.SHAPES["llama-3.1-8b"]
    factor, low, high, original = shape.rope_llama3
    config = LlamaConfig(
        hidden_size=shape.hidden,
        num_attention_heads=shape.heads,
        head_dim=shape.head_dim,
        max_position_embeddings=shape.context,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": shape.rope_theta,
            "factor": factor,
            "low_freq_factor": low,
            "high_freq_factor": high,
            "original_max_position_embeddings": original,
        },
    )
    scaled, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    dim = shape.head_dim
    plain = 1.0 / shape.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    factors = torch.from_numpy(sg.llama3_rope_factors(shape)).double()
    assert factors.shape == (64,) and factors[0] == 1 and factors[-1] == 8
    torch.testing.assert_close(plain / factors, scaled.double(), rtol=1e-5, atol=0)


@pytest.mark.parametrize("matrix_type", ["Q8_0", "Q4_0", "Q4_K", "Q6_K"])
def test_transformers_loads_the_tiny_model(tiny_files, matrix_type):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = tiny_files[matrix_type]
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name).eval()
    assert model.config.num_hidden_layers == 2 and model.config.num_key_value_heads == 2
    assert not model.config.tie_word_embeddings
    text = "Hello there, the cat"
    ids = tokenizer(text, return_tensors="pt").input_ids
    # the merges apply: " the" is one token, "re" another
    assert tokenizer.convert_ids_to_tokens(ids[0])[:7] == ["H", "e", "l", "l", "o", "Ġthe", "re"]
    assert tokenizer.decode(ids[0]) == text
    assert (tokenizer.bos_token, tokenizer.eos_token) == ("<|begin_of_text|>", "<|eot_id|>")
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert prompt.endswith("hi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], 1024)
    assert torch.isfinite(logits).all() and logits.std() > 0


def test_llama_cpp_loads_and_generates(tiny_files):
    # llama.cpp (the bench extra) is the reader that uses rope_freqs.weight and general.file_type
    llama_cpp = pytest.importorskip("llama_cpp")
    # its AMX matmul (a prompt of more than one row) crashes on CPUs with AMX: kwker.llama_cpp_amx
    off_amx = keep_llama_cpp_off_amx()
    assert off_amx == cpu_has_amx()
    assert llama_cpp.llama_cpp.llama_model_default_params().use_extra_bufts == (not off_amx)
    model = llama_cpp.Llama(
        str(tiny_files["Q4_K_M"]), n_ctx=64, n_threads=1, verbose=False, logits_all=True
    )
    tokens = model.tokenize(b"Hello there, the cat")
    assert tokens[0] == 1008 and model.detokenize(tokens[1:]) == b"Hello there, the cat"
    model.eval(tokens)
    assert np.isfinite(np.asarray(model.scores[: model.n_tokens])).all()
    model.close()


def test_rows_written_in_many_chunks(tmp_path, monkeypatch):
    # The 8B file writes its big tensors in chunks; shrink the chunk so the tiny one does too
    monkeypatch.setattr(sg, "CHUNK_BYTES", 1000)
    path = sg.write_gguf(tmp_path / "chunked.gguf", "tiny", "Q6_K", layers=1)
    reader = gguf.GGUFReader(path)
    for t in reader.tensors:
        values = dequantize(t.data, t.tensor_type)
        assert np.isfinite(values).all() and np.abs(values).max() < 10, t.name
    assert not (tmp_path / "chunked.gguf.partial").exists()


def test_command_line(tmp_path, capsys):
    out = tmp_path / "sub" / "one.gguf"
    assert sg.main([str(out), "--shape", "tiny", "--matrix-type", "Q5_0", "--layers", "1"]) == 0
    assert str(out) in capsys.readouterr().out
    reader = gguf.GGUFReader(out)
    assert field(reader, "llama.block_count") == 1
    assert {t.tensor_type for t in reader.tensors if len(t.shape) == 2} == {Q.Q5_0}


def test_same_seed_same_file(tmp_path):
    a = sg.write_gguf(tmp_path / "a.gguf", "tiny", "Q4_0", seed=3, layers=1).read_bytes()
    b = sg.write_gguf(tmp_path / "b.gguf", "tiny", "Q4_0", seed=3, layers=1).read_bytes()
    c = sg.write_gguf(tmp_path / "c.gguf", "tiny", "Q4_0", seed=4, layers=1).read_bytes()
    assert a == b != c and len(a) == len(c)


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="matrix type"):
        sg.write_gguf(tmp_path / "x.gguf", "tiny", "Q3_K")
    with pytest.raises(ValueError, match="shape"):
        sg.write_gguf(tmp_path / "x.gguf", "huge", "Q4_0")
    with pytest.raises(ValueError, match="layers"):
        sg.write_gguf(tmp_path / "x.gguf", "tiny", "Q4_0", layers=0)
