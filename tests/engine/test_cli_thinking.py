"""`kwker generate` and thinking models: --no-think switches the template's enable_thinking (the
prompt a tiny random Qwen3 is given changes) and hides the thinking; the thinking is dimmed on a
terminal only, the answer after it."""

import io

import pytest
from thinking_model import qwen3_tokenizer, tiny_qwen3

from kwker.cli import AnswerOut, main
from kwker.thinking import ThinkingFormat

FMT = ThinkingFormat("<think>", "</think>", switch=True, reads_reasoning=True)
PIECES = ["<th", "ink>\n", "Two and", " two.\n</", "think>\n\n", "Four", "."]


@pytest.fixture(scope="module")
def folder(tmp_path_factory, smollm2_tokenizer):
    path = tmp_path_factory.mktemp("tiny-qwen3")
    tok = qwen3_tokenizer(smollm2_tokenizer)
    model = tiny_qwen3(vocab=len(tok) + 6)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


class Terminal(io.StringIO):
    def isatty(self):
        return True


def shown(monkeypatch, out, **kw):
    monkeypatch.setattr("sys.stdout", out)
    answer = AnswerOut(FMT, **kw)
    for piece in PIECES:
        answer.write(piece)
    answer.close()
    return out.getvalue(), answer


def test_thinking_is_dimmed_on_a_terminal_only(monkeypatch):
    text, answer = shown(monkeypatch, Terminal())
    assert text == "\x1b[2mTwo and\x1b[0m\x1b[2m two.\x1b[0m\n\nFour.\n"
    assert answer.thinking_said() == " (5 thinking)"  # the pieces up to the closing tag
    text, _ = shown(monkeypatch, io.StringIO())
    assert text == "Two and two.\n\nFour.\n"
    text, _ = shown(monkeypatch, Terminal(), show_thinking=False)
    assert text == "Four.\n"


def test_a_servers_thinking_arrives_apart(monkeypatch):
    out = io.StringIO()
    monkeypatch.setattr("sys.stdout", out)
    answer = AnswerOut(None)
    for text, thinking in (("", "Hmm"), ("", ", four."), ("Four", ""), (".", "")):
        answer.write(text, thinking=thinking)
    answer.close()
    assert out.getvalue() == "Hmm, four.\n\nFour.\n" and answer.thinking_said() == " (2 thinking)"


def test_no_think_switches_the_prompt(folder, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KWKER_CACHE_DIR", str(tmp_path / "cache"))
    prompts = {}
    for flags in ((), ("--no-think",)):
        assert main(["generate", str(folder), "Hi", "--max-new-tokens", "3", *flags]) == 0
        err = capsys.readouterr().err
        prompts[flags] = int(err.split("prompt ")[1].split(" tokens")[0])
    tok = qwen3_tokenizer_from(folder)
    empty = tok("<think>\n\n</think>\n\n", add_special_tokens=False)["input_ids"]
    assert prompts[("--no-think",)] == prompts[()] + len(empty)


def qwen3_tokenizer_from(folder):
    from kwker.loading.tokenizer import load_tokenizer

    return load_tokenizer(folder)
