"""What of a conversation the model sees once it outgrows the context.

Two policies, as LM Studio has: the rolling window (the default) keeps the system prompt and the
newest turns and drops the oldest; "stop" refuses to answer, with the reason. The window's start
only ever moves forward, and when it moves it leaves a quarter of the context free: the next few
turns then keep the same start, so their prompts begin with the tokens already in the KV cache and
only the new turn is computed (the runner reuses the longest common prefix; see
Runner.reusable_prefix). A turn is cut whole, at a user message, so the kept history still
alternates as chat templates expect.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

ROLLING, STOP = "rolling", "stop"
POLICIES = (ROLLING, STOP)


class ContextFull(ValueError):
    """The conversation cannot be answered within the context (the reason is the message)."""


@dataclass
class Prompt:
    ids: list[int]  # the prompt's token ids: system prompt + messages[start:]
    start: int  # the index of the first message the model sees
    room: int  # how many tokens the answer may take


def window_start(messages, context_from: int) -> int:
    """The index of the first of `messages` the model sees: the first whose id is at least
    context_from (the rolling window's first message id, as the store keeps it; 0: all)."""
    if context_from <= 0:
        return 0
    return next((i for i, m in enumerate(messages) if m.id >= context_from), 0)


def answer_reserve(context: int, max_new_tokens: int) -> int:
    """The room a prompt must leave for the answer: max_new_tokens, but at most half the context
    (a long answer limit must not squeeze the history down to the last message)."""
    return max(1, min(max_new_tokens, context // 2))


def fit_prompt(
    render: Callable[[list[dict]], list[int]],
    system: str,
    messages: list[dict],
    start: int,
    context: int,
    max_new_tokens: int,
    policy: str = ROLLING,
) -> Prompt:
    """The prompt for answering `messages` (role/content dicts; the last is the user's turn) within
    `context` tokens. `render` turns messages into token ids (the chat template); `start` is the
    window's start so far (0: all of the conversation). Raises ContextFull with the reason when
    the policy is STOP and the conversation no longer fits, or when the newest message alone does
    not fit."""
    if policy not in POLICIES:
        raise ValueError(f"context overflow policy must be one of {POLICIES}, got {policy!r}")
    head = [{"role": "system", "content": system}] if system else []
    reserve = answer_reserve(context, max_new_tokens)
    start = min(start, len(messages) - 1)
    ids = render(head + messages[start:])
    if len(ids) + reserve <= context:
        return Prompt(ids, start, context - len(ids))
    if policy == STOP:
        raise ContextFull(
            f"the conversation is {len(ids)} tokens: with room for a {reserve}-token answer it no "
            f"longer fits the context of {context} tokens. Start a new chat, raise the context "
            "length, or let the oldest messages go (Settings: rolling window)"
        )
    cuts = [i for i in range(start + 1, len(messages)) if messages[i]["role"] == "user"]
    target = context - reserve - context // 4  # headroom: the next turns keep this start
    fallback = None
    for cut in cuts:
        ids = render(head + messages[cut:])
        if len(ids) <= target:
            return Prompt(ids, cut, context - len(ids))
        if fallback is None and len(ids) + reserve <= context:
            fallback = Prompt(ids, cut, context - len(ids))
    if fallback is not None:
        return fallback
    last = cuts[-1] if cuts else start
    ids = render(head + messages[last:])
    if len(ids) >= context:
        raise ContextFull(
            f"the newest message is {len(ids)} tokens with the system prompt: more than the "
            f"context of {context} tokens. Shorten it or raise the context length"
        )
    # a shorter answer than asked: all there is room for
    return Prompt(ids, last, context - len(ids))
