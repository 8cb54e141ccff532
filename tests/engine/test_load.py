"""kwker.load, the one door to a decoder: a GGUF file and a safetensors folder give decoders that
generate what the files' own loader and KwkDecoder generate, its options reach the decoder, its
keywords are load_files's, and importing kwker stays cheap (no numpy, no torch)."""

import inspect
import subprocess
import sys

import numpy as np
import pytest
import synthetic_gguf as sg
from helpers import tiny_llama

import kwker
from kwker.generation import StepDecoder
from kwker.hf import KwkDecoder
from kwker.loading.load import FileDecoder, load_files

PROMPT = [3, 17, 250, 9, 40, 511, 7, 99, 300, 12, 5, 6, 44]


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KWKER_CACHE_DIR", str(tmp_path / "cache"))


def tokens(dec, prompt=PROMPT, n=24) -> list[int]:
    return np.asarray(dec.generate(prompt, max_new_tokens=n, min_new_tokens=n)).ravel().tolist()


def test_a_gguf_file_generates_what_load_files_generates(tmp_path):
    path = sg.write_gguf(tmp_path / "Tiny-Q8_0.gguf", "tiny", "Q8_0", seed=3)
    dec = kwker.load(str(path), max_cache_len=64)
    assert isinstance(dec, FileDecoder) and isinstance(dec, kwker.StepDecoder)
    assert dec.path == path and dec.precision == "balanced"  # Q8_0's nearest: the file's own
    ours = tokens(dec)
    assert ours[: len(PROMPT)] == PROMPT and len(set(ours[len(PROMPT) :])) > 1
    assert ours == tokens(load_files(path, max_cache_len=64, cache=False))
    ids = dec.tokenizer("hello there")["input_ids"]
    assert tokens(dec, ids) == tokens(load_files(path, max_cache_len=64, cache=False), ids)


def test_a_safetensors_folder_generates_what_kwkdecoder_generates(tmp_path):
    model = tiny_llama(tied=False)
    model.save_pretrained(tmp_path / "m")
    for precision in (None, "int4"):
        dec = kwker.load(str(tmp_path / "m"), max_cache_len=64, precision=precision)
        theirs = KwkDecoder(model, max_cache_len=64, precision=precision)
        assert dec.precision == theirs.precision
        assert tokens(dec) == tokens(theirs)


def test_the_options_reach_the_decoder(tmp_path):
    path = sg.write_gguf(tmp_path / "Tiny-Q4_K.gguf", "tiny", "Q4_K", seed=1)
    said = []
    dec = kwker.load(
        str(path), max_cache_len=48, precision="int8", threads=1, max_batch=3,
        max_step_tokens=8, kv_cache="fp32", cache=False, progress=said.append,
    )  # fmt: skip
    assert (dec.precision, dec.max_cache_len, dec.threads) == ("balanced", 48, 1)
    assert (dec.max_batch, dec.runner.max_step_tokens, dec.kv_cache) == (3, 8, "fp32")
    assert not dec.from_cache and any("packing" in s for s in said)
    assert not (tmp_path / "cache").exists()  # cache=False: nothing written
    # 13 prompt tokens through 8-token prefill steps: the same tokens as one step
    one_step = load_files(path, max_cache_len=48, precision="balanced", kv_cache="fp32")
    assert tokens(dec) == tokens(one_step)
    with pytest.raises(TypeError, match="max_tokens"):
        kwker.load(str(path), max_tokens=10)


def test_load_takes_load_files_keywords_with_its_defaults():
    ours = inspect.signature(kwker.load).parameters
    theirs = dict(inspect.signature(load_files).parameters)
    del theirs["model_path"]
    assert list(ours)[1:] == list(theirs)
    for name, p in theirs.items():
        assert ours[name].kind == inspect.Parameter.KEYWORD_ONLY
        # max_step_tokens: None stands for the runner's default, which kwker does not import
        assert ours[name].default == (None if name == "max_step_tokens" else p.default), name


def test_a_missing_file_is_named(tmp_path):
    from kwker.models.loader import ModelNotFound

    with pytest.raises(ModelNotFound, match="no such GGUF file"):
        kwker.load(str(tmp_path / "nothing.gguf"))


def test_importing_kwker_loads_no_numpy_or_torch():
    code = (
        "import sys, kwker\n"
        "heavy = lambda: sorted({m.split('.')[0] for m in sys.modules} & {'numpy', 'torch',"
        " 'transformers', 'huggingface_hub'})\n"
        "print(heavy())\n"
        "assert callable(kwker.load) and 'load' in dir(kwker) and 'KwkDecoder' in dir(kwker)\n"
        "kwker.StepDecoder\n"
        "print(heavy())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[:2] == ["[]", "['numpy']"]  # StepDecoder's core needs numpy


def test_the_lazy_names_are_the_classes():
    assert kwker.StepDecoder is StepDecoder and kwker.KwkDecoder is KwkDecoder
    with pytest.raises(AttributeError, match="no attribute 'Decoder'"):
        kwker.Decoder  # noqa: B018
