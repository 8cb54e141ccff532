"""Thinking models (kwker.thinking): the tags read from the template, the splitter on pieces cut
anywhere, the switch in the prompt, earlier thinking in later prompts as the template wants it,
and `kwker serve`'s reasoning_content, whole and streamed, from a tiny random Qwen3 whose answer
a grammar forces (a random model would not think by itself)."""

import copy
import json

import httpx
import pytest
from serving import running
from thinking_model import QWEN3_TEMPLATE, qwen3_tokenizer, tiny_qwen3

from kwker.hf import KwkDecoder
from kwker.serve import ServingEngine, create_app
from kwker.thinking import (
    ANSWER,
    THINKING,
    ThinkingFormat,
    ThinkingSplitter,
    for_template,
    raw_text,
    split_text,
    starts_inside,
    template_kwargs,
    thinking_format,
)

FMT = ThinkingFormat("<think>", "</think>", switch=True, reads_reasoning=True)
WRITTEN = "<think>\nFirst, 2 < 3 and </b> is no tag.\n\nSo: yes.\n</think>\n\nYes, 2 < 3.\n"
THOUGHT = "First, 2 < 3 and </b> is no tag.\n\nSo: yes."
SAID = "Yes, 2 < 3.\n"


def feed_all(splitter, pieces):
    thinking = answer = ""
    for piece in pieces:
        t, a = splitter.feed(piece)
        thinking, answer = thinking + t, answer + a
    t, a = splitter.flush()
    return thinking + t, answer + a


@pytest.fixture(scope="module")
def tokenizer(smollm2_tokenizer):
    return qwen3_tokenizer(smollm2_tokenizer)


def test_every_cut_into_pieces_splits_alike():
    assert tuple(split_text(FMT, WRITTEN)) == (THOUGHT, SAID)
    for i in range(len(WRITTEN)):
        for j in range(i, len(WRITTEN)):
            pieces = [WRITTEN[:i], WRITTEN[i:j], WRITTEN[j:]]
            assert feed_all(ThinkingSplitter(FMT), pieces) == (THOUGHT, SAID), (i, j)
    # one character a piece: each tag arrives in seven or eight pieces
    assert feed_all(ThinkingSplitter(FMT), list(WRITTEN)) == (THOUGHT, SAID)


def test_what_is_held_back_and_when():
    s = ThinkingSplitter(FMT)
    assert s.feed("  <thi") == ("", "")  # maybe the opening tag: nothing said yet
    assert s.feed("nk>\nabc\n</th") == ("abc", "")  # the newline may precede the closing tag
    assert s.phase == THINKING
    assert s.feed("ink>\n\nAns") == ("", "Ans")
    assert s.phase == ANSWER
    assert s.feed("wer <think>x</think>") == ("", "wer <think>x</think>")  # after: text
    # an answer that does not start with the tag is all answer, as written
    word = ["\n<thin", "g> is a word"]
    assert feed_all(ThinkingSplitter(FMT), word) == ("", "\n<thing> is a word")
    # a stream cut inside the thinking: it is all thinking, the partial tag too
    assert feed_all(ThinkingSplitter(FMT), ["<think>deep", " thought</thi"]) == (
        "deep thought</thi", "")  # fmt: skip


def test_a_prompt_that_opened_the_thinking_starts_inside(tokenizer):
    r1 = copy.deepcopy(tokenizer)  # DeepSeek-R1's way: its generation prompt opens the tag
    r1.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}"
    )
    fmt = thinking_format(r1)
    assert (fmt.open, fmt.close, fmt.switch) == ("<think>", "</think>", False)
    ids = r1.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    assert starts_inside(r1, ids, fmt)
    assert not starts_inside(r1, ids[:-3], fmt)
    split = ThinkingSplitter(fmt, inside=True)
    assert feed_all(split, ["\nHmm, hi.", "\n</think>", "\n\nHello!"]) == ("Hmm, hi.", "Hello!")
    assert split.thinking_tokens == 2  # the closing tag's piece counts: it ends the thinking


def test_the_tags_come_from_the_template_or_the_vocabulary(tokenizer, smollm2_tokenizer):
    assert thinking_format(smollm2_tokenizer) is None  # SmolLM2 does not think
    fmt = thinking_format(tokenizer)
    assert fmt == ThinkingFormat("<think>", "</think>", switch=True, reads_reasoning=True)
    magistral = copy.deepcopy(smollm2_tokenizer)
    magistral.chat_template = "{{ '[THINK]' }}{% if x %}[/THINK]{% endif %}<b></b>"
    assert (thinking_format(magistral).open, thinking_format(magistral).close) == (
        "[THINK]", "[/THINK]")  # fmt: skip
    # no tags in the template, but in the vocabulary, as special tokens: their ids are known
    special = copy.deepcopy(smollm2_tokenizer)
    special.add_tokens(["<reasoning>", "</reasoning>"], special=True)
    fmt = thinking_format(special)
    assert (fmt.open, fmt.close, fmt.switch) == ("<reasoning>", "</reasoning>", False)
    assert (fmt.open_id, fmt.close_id) == tuple(
        special.convert_tokens_to_ids(["<reasoning>", "</reasoning>"]))  # fmt: skip
    # a special tag's text is skipped by the detokenizer: the splitter goes by its id
    split = ThinkingSplitter(fmt)
    pieces = [("", fmt.open_id), ("why", 5), ("", fmt.close_id), ("so", 6)]
    assert [tuple(split.feed(t, tok)) for t, tok in pieces] == [
        ("", ""), ("why", ""), ("", ""), ("", "so")]  # fmt: skip


def test_the_switch_changes_the_prompt(tokenizer):
    fmt = thinking_format(tokenizer)
    chat = [{"role": "user", "content": "Is 2 < 3?"}]

    def prompt(enable):
        return tokenizer.apply_chat_template(
            chat, add_generation_prompt=True, tokenize=False, **template_kwargs(fmt, enable)
        )

    assert template_kwargs(fmt, None) == {}
    assert template_kwargs(fmt, False) == {"enable_thinking": False}
    assert template_kwargs(None, False) == {}  # no switch: the template is left alone
    asked = "<|im_start|>user\nIs 2 < 3?<|im_end|>\n<|im_start|>assistant\n"
    assert prompt(None) == prompt(True) == asked
    assert prompt(False) == prompt(True) + "<think>\n\n</think>\n\n"


def test_earlier_thinking_goes_back_only_as_the_template_wants(tokenizer, smollm2_tokenizer):
    fmt = thinking_format(tokenizer)
    stored = [
        {"role": "user", "content": "Q1"},
        {"role": "assistant", "content": "A1", "thinking": "T1"},
        {"role": "user", "content": "Q2"},
        {"role": "assistant", "content": "A2", "thinking": "T2"},  # a cut answer continued
    ]
    given = [for_template(m, fmt) for m in stored]
    assert given[1] == {"role": "assistant", "content": "A1", "reasoning_content": "T1"}
    text = tokenizer.apply_chat_template(given, tokenize=False)
    # Qwen3's template drops the first answer's thinking, keeps the one after the last question
    assert "T1" not in text and "A1<|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n<think>\nT2\n</think>\n\nA2<|im_end|>\n")
    # a template that reads no reasoning_content is given none: the thinking stays out
    plain = [for_template(m, thinking_format(smollm2_tokenizer)) for m in stored]
    assert all("reasoning_content" not in m and "thinking" not in m for m in plain)
    assert raw_text(fmt, "T2", "A2", inside=False) == "<think>\nT2\n</think>\n\nA2"
    assert raw_text(fmt, "T2", "", inside=True) == "T2"  # cut inside the thinking
    assert raw_text(fmt, "", "A2", inside=False) == "A2"


# ------------------------------------------------------------------------------- kwker serve
@pytest.fixture(scope="module")
def served(tokenizer):
    model = tiny_qwen3(vocab=len(tokenizer) + 6)
    model.config.eos_token_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    dec = KwkDecoder(model, max_cache_len=512, max_batch=2, tokenizer=tokenizer)
    engine = ServingEngine(dec, tokenizer)
    with engine, running(create_app(engine, "tiny-qwen3")) as url:
        yield url


def thinking_grammar(tokenizer) -> str:
    """A Lark grammar (llguidance's: <[id]> is a token) that makes the model think, then answer."""
    open_id, close_id = tokenizer.convert_tokens_to_ids(["<think>", "</think>"])
    return f'start: <[{open_id}]> "\\nOne and one.\\n" <[{close_id}]> "\\n\\nTwo."'


def ask(url, tokenizer, **extra):
    body = {"messages": [{"role": "user", "content": "1+1?"}], "max_tokens": 40,
            "temperature": 0, "grammar": thinking_grammar(tokenizer), **extra}  # fmt: skip
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)


def test_serve_returns_the_thinking_apart(served, tokenizer):
    r = ask(served, tokenizer)
    assert r.status_code == 200, r.text
    out = r.json()
    message = out["choices"][0]["message"]
    assert message == {"role": "assistant", "content": "Two.", "reasoning_content": "One and one."}
    assert out["choices"][0]["finish_reason"] == "stop"
    usage = out["usage"]
    # <think>, the newline, 4 words, the newline, </think>: the tags are thinking's tokens
    spelled = tokenizer("\nOne and one.\n", add_special_tokens=False)["input_ids"]
    assert usage["completion_tokens_details"]["reasoning_tokens"] == len(spelled) + 2
    assert usage["completion_tokens"] > usage["completion_tokens_details"]["reasoning_tokens"]


def test_serve_streams_the_thinking_as_reasoning_content(served, tokenizer):
    deltas = []
    with httpx.stream(
        "POST", f"{served}/v1/chat/completions", timeout=120,
        json={"messages": [{"role": "user", "content": "1+1?"}], "max_tokens": 40,
              "temperature": 0, "grammar": thinking_grammar(tokenizer), "stream": True,
              "stream_options": {"include_usage": True}},
    ) as r:  # fmt: skip
        events = [json.loads(x[6:]) for x in r.iter_lines() if x.startswith("data: {")]
    deltas = [e["choices"][0]["delta"] for e in events if e["choices"]]
    thinking = "".join(d.get("reasoning_content", "") for d in deltas)
    answer = "".join(d.get("content") or "" for d in deltas)
    assert (thinking, answer) == ("One and one.", "Two.")
    # no delta mixes them here, and a thinking delta carries no content
    assert all(not ("reasoning_content" in d and "content" in d) for d in deltas)
    first_answer = next(i for i, d in enumerate(deltas) if d.get("content"))
    assert all("content" not in d for d in deltas[1:first_answer])
    assert events[-1]["usage"]["completion_tokens_details"]["reasoning_tokens"] > 0


def test_serve_switch_and_history(served, tokenizer):
    base = {"messages": [{"role": "user", "content": "1+1?"}], "max_tokens": 3, "temperature": 0}
    on = httpx.post(f"{served}/v1/chat/completions", json=base, timeout=60).json()
    off = httpx.post(
        f"{served}/v1/chat/completions", timeout=60,
        json={**base, "chat_template_kwargs": {"enable_thinking": False}},
    ).json()  # fmt: skip
    empty = tokenizer("<think>\n\n</think>\n\n", add_special_tokens=False)["input_ids"]
    assert off["usage"]["prompt_tokens"] == on["usage"]["prompt_tokens"] + len(empty)
    # an answer's reasoning_content sent back is taken, and the template drops it for an earlier
    # turn: the prompt is the same with or without it
    turns = [base["messages"][0], {"role": "assistant", "content": "Two."},
             {"role": "user", "content": "And 2+2?"}]  # fmt: skip
    plain = httpx.post(f"{served}/v1/chat/completions", timeout=60,
                       json={**base, "messages": turns}).json()  # fmt: skip
    turns[1] = {**turns[1], "reasoning_content": "One and one, a long thought."}
    sent = httpx.post(f"{served}/v1/chat/completions", timeout=60,
                      json={**base, "messages": turns}).json()  # fmt: skip
    assert sent["usage"]["prompt_tokens"] == plain["usage"]["prompt_tokens"]
    r = httpx.post(f"{served}/v1/chat/completions", timeout=60,
                   json={**base, "chat_template_kwargs": {"tokenize": False}})  # fmt: skip
    assert r.status_code == 400 and r.json()["error"]["param"] == "chat_template_kwargs"


def test_qwen3_template_fixture_is_the_one_served(tokenizer):
    assert tokenizer.chat_template == QWEN3_TEMPLATE
