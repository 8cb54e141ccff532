"""What the window chats with, behind the one interface the worker drives: a LocalBackend (a
KwkDecoder on this machine, and its draft) or a RemoteBackend (a model on an OpenAI-compatible
server: `kwker serve`, vLLM, SGLang, llama.cpp's server, Ollama's /v1).

    backend = backend_for(opts).load(opts, progress)   # raises with the reason it cannot be used
    backend.info                                       # what the window shows about it
    answer = backend.answer(messages, settings, start, documents)
    answer.start                                       # the first message the model sees
    answer.documents                                   # what of the documents went in (cited)
    for piece in answer: ...                           # .text .token .source .stats .finish_reason
                                                       # .thinking (a thinking model's, apart)
    answer.close()                                     # ends it early (Stop)
    answer.stats()                                     # its figures so far (a dict)

A piece's stats is a dict only when fresh figures came with it (None otherwise): the local ones
cost a few medians, and the window draws at most every 33 ms. Figures are
GenerationStats.summary()'s keys plus elapsed_s; a remote answer's also say who measured them
(measured: "server" for a Kwker server, which reports the same keys, "client" for any other, see
kwker.remote). A thinking model's answer (kwker.thinking) adds thinking_tokens and thinking_s: how
much of it, and how long, was thinking. Messages are {role, content, thinking, tool_calls} dicts:
the thinking goes back into a prompt only as the model's template wants it
(kwker.thinking.for_template), never to a server; an answer's tool calls become the turns the
template or the server wants (kwker.app.tool_calls).

tools (OpenAI's function list; kwker.app.tool_calls.functions) are offered to the model: a local
one's template gets them and its calls are parted from its text as they stream (kwker.tools: their
arguments follow the tool's schema), a server gets them as `tools` and sends its calls apart. Either
way the pieces carry the answer's text only, and `answer.tool_calls` holds the calls at the end
(kwker.tools.ToolCall: id, name, arguments as JSON text); the worker runs them and asks again."""

from __future__ import annotations

import time
from dataclasses import dataclass

from kwker.app import keys
from kwker.app.context_window import answer_reserve, fit_prompt
from kwker.app.documents import build_context, with_documents
from kwker.app.settings import generation_options, remote_sampling
from kwker.app.tool_calls import expand, for_server
from kwker.remote import AUTH, NOT_FOUND, RemoteError, RemoteModel, list_models, normalize_url
from kwker.thinking import (
    ANSWER,
    THINKING,
    ThinkingSplitter,
    for_template,
    raw_text,
    starts_inside,
    template_kwargs,
    thinking_format,
)
from kwker.tools import ToolCall, ToolCallParser, new_call_id, tool_format
from kwker.tools import for_template as tools_for_template

STATS_EVERY_S = 0.05  # local pieces carry fresh statistics at most this often (the window draws
# at most every 33 ms; the speedup's medians cost more than a token's other work)


@dataclass
class Piece:
    text: str
    token: int  # -1 from a server, which sends text
    source: str  # "" / "lookup" / "draft"
    stats: dict | None  # fresh figures, or None
    finish_reason: str | None = None  # on the last piece
    thinking: str = ""  # a thinking model's thinking (text is then its answer only)


def backend_for(opts: dict):
    """The backend class for load options: a server when one is set, else this machine."""
    return RemoteBackend if opts.get("server_url") else LocalBackend


# ------------------------------------------------------------------------------------------ local
class LocalBackend:
    remote = False

    def __init__(self, decoder, draft, info: dict):
        self.decoder, self.draft, self.tokenizer, self.info = (
            decoder,
            draft,
            decoder.tokenizer,
            info,
        )
        self.last_prompt: list[int] = []  # the token ids of the latest answer's prompt
        chat = bool(getattr(self.tokenizer, "chat_template", None))
        self.thinking = thinking_format(self.tokenizer) if chat else None  # kwker.thinking
        # whether the model thinks, and whether its template can turn that off (the Think toggle)
        info["thinks"] = self.thinking is not None
        info["think_switch"] = bool(self.thinking and self.thinking.switch)
        # how the model writes tool calls (None: its template takes no tools: none are offered)
        self.tool_format = tool_format(self.tokenizer) if chat else None
        info["tools"] = self.tool_format is not None

    @classmethod
    def load(cls, opts: dict, progress) -> LocalBackend:
        from kwker.models.loader import load_decoder
        from kwker.precision import DRAFT, canonical

        precision = canonical(opts["precision"])  # None: the model's own
        threads = opts["threads"] or None
        decoder = load_decoder(
            opts["model"], progress=progress, max_cache_len=int(opts["context_length"]),
            precision=precision, threads=threads,
        )  # fmt: skip
        draft = None
        if opts.get("draft_model"):
            progress(f"loading draft {opts['draft_model']}")
            draft = load_decoder(
                opts["draft_model"], progress=progress, max_cache_len=int(opts["context_length"]),
                precision=DRAFT, threads=threads, fewest_bytes=True,
            )  # fmt: skip
            decoder.check_draft(draft)
        from kwker.models.catalog import entry
        from kwker.models.presets import model_preset

        preset = model_preset(decoder, opts["model"])
        listed = entry(opts["model"])
        info = {
            "model": opts["model"],
            "server": "",
            # the sampling the model answers well at (kwker.models.presets), and where from
            "preset": {"values": preset.values, "sources": preset.sources},
            "precision": decoder.precision,
            "isa": decoder.isa,
            "threads": decoder.threads,
            "context_length": decoder.max_cache_len,
            "draft": opts.get("draft_model") or "",
            "chat_template": bool(getattr(decoder.tokenizer, "chat_template", None)),
        }
        # a base model continues text rather than answering: its catalog entry says so, or it
        # has no chat template
        info["base"] = bool(listed and listed.base) or not info["chat_template"]
        return cls(decoder, draft, info)

    def _prompt_ids(
        self, messages: list[dict], think: bool | None = None, tools: list | None = None
    ) -> list[int]:
        """The prompt for messages; one that ends with an answer (cut at max_new_tokens) is the
        prompt of that answer followed by its text (its thinking's too, as the model wrote it),
        which the model then continues; one whose answer ends with a tool's result is the prompt
        of a new answer after it. think: a thinking model's enable_thinking (None: its template's
        default); tools: those the model is offered."""
        fmt = self.thinking
        turns = expand(messages)
        if turns and turns[-1]["role"] == "assistant":
            prompt = self._render(turns[:-1], think, tools)
            last = turns[-1]
            text = last["content"]
            if fmt is not None and last.get("thinking"):
                inside = starts_inside(self.tokenizer, prompt, fmt)
                text = raw_text(fmt, last["thinking"], text, inside)
            return prompt + list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        return self._render(turns, think, tools)

    def _render(self, turns: list[dict], think: bool | None, tools: list | None) -> list[int]:
        fmt = self.thinking
        if getattr(self.tokenizer, "chat_template", None):
            extra = template_kwargs(fmt, think) | ({"tools": tools} if tools else {})
            return list(
                self.tokenizer.apply_chat_template(
                    [for_template(m, fmt) for m in tools_for_template(turns)],
                    add_generation_prompt=True, tokenize=True, return_dict=True, **extra,
                )["input_ids"]
            )  # fmt: skip
        text = "\n\n".join(m["content"] for m in turns) + "\n\n"
        return self.tokenizer(text)["input_ids"]

    def answer(
        self, messages: list[dict], settings: dict, start: int, documents: list[dict] = (),
        draft: bool = True, tools: list | None = None,
    ) -> LocalAnswer:  # fmt: skip
        """Answers messages from the rolling window's start so far (kwker.app.context_window),
        from the attached documents ({name, text} dicts) that fit beside them. draft=False leaves
        the draft model out (the split view's plain run); tools: see the module's doc (left out
        for a model whose template takes none)."""
        max_new = int(settings["max_new_tokens"])
        context = self.decoder.max_cache_len
        think = settings.get("think")
        tools = tools if self.tool_format is not None else None

        def fit(msgs: list[dict], first: int):
            return fit_prompt(
                lambda m: self._prompt_ids(m, think, tools),
                settings.get("system_prompt", "").strip(),
                msgs, first, context, max_new, settings["context_overflow"],
            )  # fmt: skip

        prompt = fit(messages, start)
        cited = []
        # the documents get the room the chat leaves, the answer's kept free (not on a continuation)
        if documents and messages[-1]["role"] == "user":
            budget = prompt.room - answer_reserve(context, max_new)
            docs = build_context(documents, messages[-1]["content"], budget, self._count)
            asked = [*messages[:-1], {**messages[-1], "content": with_documents(
                messages[-1]["content"], docs)}]  # fmt: skip
            prompt, cited = fit(asked, prompt.start), docs.cited
        self.last_prompt = prompt.ids
        opts = generation_options(settings)
        if self.draft is not None and draft:
            opts["draft"] = self.draft
        if tools:  # a call's arguments follow its tool's schema (kwker.tools)
            opts.update(tools=tools, tool_choice="auto")
        stream = self.decoder.stream_generate(
            prompt.ids, min(max_new, prompt.room), tokenizer=self.tokenizer, **opts
        )
        calls = None
        if tools:
            names = frozenset(t["function"]["name"] for t in tools)
            calls = ToolCallParser(self.tool_format, names=names)
        return LocalAnswer(prompt.start, stream, cited, self._splitter(messages, prompt.ids), calls)

    def _splitter(self, messages: list[dict], ids: list[int]) -> ThinkingSplitter | None:
        """A thinking model's splitter for the answer to prompt `ids`; a continued answer goes on
        where it was cut (in its thinking when it has no answer text yet); an answer after a
        tool's result is a new turn."""
        if self.thinking is None:
            return None
        turns = expand(messages[-1:])
        last = turns[-1] if turns and turns[-1]["role"] == "assistant" else {}
        if last.get("role") == "assistant" and (last.get("content") or last.get("thinking")):
            phase = ANSWER if last.get("content") else THINKING
            return ThinkingSplitter(self.thinking, phase=phase)
        return ThinkingSplitter(self.thinking, starts_inside(self.tokenizer, ids, self.thinking))

    def _count(self, text: str) -> int:
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])


class LocalAnswer:
    def __init__(self, start: int, stream, documents: list[dict] = (), split=None, calls=None):
        """split: a thinking model's ThinkingSplitter (None: the text is all answer); calls: a
        kwker.tools.ToolCallParser when tools were offered."""
        self.start, self._stream, self.documents = start, stream, list(documents)
        self._calls = calls
        self.tool_calls: list[ToolCall] = []
        self._t0 = time.perf_counter()
        self._last = None  # the latest GenerationStats
        self._split = split
        self._thought_s: float | None = None  # when the thinking ended

    def __iter__(self):
        sent = self._t0
        for c in self._stream:
            self._last, now = c.stats, time.perf_counter()
            text, thinking = c.text, ""
            if self._split is not None:
                thinking, text = self._split.feed(c.text, c.token)
                if c.finish_reason:  # what the splitter held back, at the end
                    last = self._split.flush()
                    thinking, text = thinking + last.thinking, text + last.answer
                if self._thought_s is None and self._split.phase == ANSWER:
                    self._thought_s = now - self._t0
            if self._calls is not None:  # the calls' text is parted from the answer's
                text = self._calls.feed(text, None if thinking else c.token).text
                if c.finish_reason:
                    text += self._calls.flush().text
                    self.tool_calls = list(self._calls.calls)
            fresh = now - sent >= STATS_EVERY_S
            if fresh:
                sent = now
            yield Piece(
                text, c.token, c.source or "", self.stats() if fresh else None, c.finish_reason,
                thinking,
            )  # fmt: skip

    def close(self) -> None:
        self._stream.close()  # stops the native loop

    def stats(self) -> dict:
        if self._last is None:
            return {}
        summary = self._last.summary() | {"elapsed_s": time.perf_counter() - self._t0}
        if self._split is not None and self._split.thinking_tokens:
            summary["thinking_tokens"] = self._split.thinking_tokens
            summary["thinking_s"] = self._thought_s or summary["elapsed_s"]
        return summary | ({"documents": self.documents} if self.documents else {})


# ----------------------------------------------------------------------------------------- remote
class RemoteBackend:
    """A model on a server. The server applies its own precision, context and speculation: the
    whole conversation is sent (the rolling window is a local decoder's), and a prompt longer than
    the server's context comes back as its refusal, said in the window."""

    remote = True

    def __init__(self, model, info: dict):
        self.model, self.info = model, info

    @classmethod
    def load(cls, opts: dict, progress) -> RemoteBackend:
        url, name = normalize_url(opts["server_url"]), opts["server_model"]
        progress(f"connecting to {url}")
        key = keys.load_key(url)
        # the server's list: whether it is there, takes the key, and still has the model
        try:
            offered = list_models(url, key)
        except RemoteError as e:
            if e.kind == AUTH:  # where to give it one
                raise RemoteError(AUTH, f"{e} Models… → Servers takes a new key.") from e
            raise
        if name not in offered:
            raise RemoteError(
                NOT_FOUND,
                f"The server at {url} has no model “{name}”; it offers "
                f"{', '.join(offered) or 'none'}.",
            )
        info = {"model": name, "server": url, "draft": "", "chat_template": True}
        return cls(RemoteModel(url, name, key), info)

    def answer(
        self, messages: list[dict], settings: dict, start: int, documents: list[dict] = (),
        tools: list | None = None,
    ) -> RemoteAnswer:  # fmt: skip
        system = settings.get("system_prompt", "").strip()
        # role and content (and calls): an earlier answer's thinking stays here
        turns = for_server(expand(messages))
        chat = ([{"role": "system", "content": system}] if system else []) + turns
        cited = []
        # the server's context is not known here: a budget most servers have room for (the first
        # question's: an answer's later rounds, after a tool's result, go without)
        if documents and chat[-1]["role"] == "user":
            docs = build_context(documents, chat[-1]["content"], REMOTE_DOCUMENT_TOKENS, _estimate)
            chat[-1] = {**chat[-1], "content": with_documents(chat[-1]["content"], docs)}
            cited = docs.cited
        chunks = self.model.stream_chat(
            chat, max_tokens=int(settings["max_new_tokens"]), tools=tools or None,
            **remote_sampling(settings),
        )  # fmt: skip
        return RemoteAnswer(chunks, cited)


# The documents' share of a server's prompt, in tokens estimated from characters (the server's
# tokenizer is not here): 4 characters a token is English text's usual rate
REMOTE_DOCUMENT_TOKENS = 6000


def _estimate(text: str) -> int:
    return len(text) // 4 + 1


class RemoteAnswer:
    start = 0  # the server sees the whole conversation

    def __init__(self, chunks, documents: list[dict] = ()):
        self._chunks = chunks  # kwker.remote.RemoteChunk: the same fields as a Piece
        self._last: dict = {}
        self.documents = list(documents)
        self._t0 = time.perf_counter()
        self._thought = 0  # the server's thinking deltas (one token each, as servers send them)
        self._thought_s = 0.0
        self.tool_calls: list[ToolCall] = []

    def __iter__(self):
        for c in self._chunks:
            for call in c.tool_calls or ():  # on the last chunk: {id, name, arguments}
                self.tool_calls.append(
                    ToolCall(call["id"] or new_call_id(None), call["name"], call["arguments"])
                )
            if c.thinking:
                self._thought += 1
                self._thought_s = time.perf_counter() - self._t0
            if c.stats:
                self._last = c.stats
            yield c

    def close(self) -> None:
        self._chunks.close()  # closes the HTTP response: the server stops generating

    def stats(self) -> dict:
        thought = {"thinking_tokens": self._thought, "thinking_s": self._thought_s}
        return (
            self._last
            | (thought if self._thought else {})
            | ({"documents": self.documents} if self.documents else {})
        )
