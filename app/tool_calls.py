"""Tool calls in answers: how an answer's calls are kept, how they go back into a prompt, and how
the worker waits for the user's approval.

An answer that calls tools stays one assistant message: its text, and `tool_calls`, a list of
records in the order made, each

    {"id": "call-1", "server": "files", "tool": "read_file", "name": "read_file",
     "arguments": {...}, "status": "done", "result": "…", "seconds": 0.2, "at": 12}

(`tool`: the server's name for it; `name`: the name the model was offered, the same unless two
servers have a tool of that name; `at`: where in the answer's text the call was made; `status`:
"asking" for the user's approval, "running", then "done", "error", "timeout" or "denied"). So
branches, regeneration, forks and exports treat it as any answer, and `expand` rebuilds the turns
a chat template or a server wants: the assistant's text up to a call, the call, the tool's
result as a tool turn, and so on to the text after the last call."""

from __future__ import annotations

import json
import re
import threading

from kwker.app.mcp_host import ToolInfo

ENDED = ("done", "error", "timeout", "denied")
DENIED_RESULT = "The user did not allow this call, so the tool was not run."
UNFINISHED_RESULT = "The call did not finish (the app was closed while it ran)."
# Rounds of calls in one answer (its calls may be several at once): past them the model answers
# without tools. Offered the tools again after a result, Qwen2.5-Coder-1.5B echoes its template's
# call example ({{"name": …}}) instead of answering, whether it runs here or on a server (kwker
# serve: seen in tests/app/test_mcp_tools.py), and answers from the result when they are left out.
# What a server runs is not known here, so a server's model gets the same one round.
TOOL_ROUNDS = 1
# how the approval is answered
ALLOW_ONCE, ALLOW_ALWAYS, DENY = "once", "always", "deny"


def offered(tools: list[ToolInfo]) -> dict[str, ToolInfo]:
    """The tools as the model is offered them, by the name it calls them by: a tool's own name,
    or server_tool where two servers have a tool of the same name (names as function names
    allow: letters, digits, _ and -)."""
    counts: dict[str, int] = {}
    for t in tools:
        counts[t.name] = counts.get(t.name, 0) + 1
    named = {}
    for t in tools:
        name = t.name if counts[t.name] == 1 else f"{t.server}_{t.name}"
        named[re.sub(r"[^A-Za-z0-9_-]", "_", name)[:64]] = t
    return named


def functions(named: dict[str, ToolInfo]) -> list[dict]:
    """The tools in the OpenAI API's form, which chat templates take too."""
    return [
        {"type": "function", "function": {
            "name": name, "description": t.description,
            "parameters": t.schema or {"type": "object", "properties": {}}}}
        for name, t in named.items()
    ]  # fmt: skip


def result_for_model(call: dict) -> str:
    if call["status"] == "denied":
        return DENIED_RESULT
    if call["status"] not in ENDED:
        return UNFINISHED_RESULT
    return call.get("result", "")


def expand(messages: list[dict]) -> list[dict]:
    """Messages ({role, content, thinking?, tool_calls?}) as chat turns: an answer with calls
    becomes its text up to each call, with the call (tool_calls in the template's form:
    arguments as an object), then a tool turn per call with its result; the text after the last
    call is the last turn (none when empty: the model answers after the result). A message without
    calls stays as it is."""
    turns = []
    for m in messages:
        calls = m.get("tool_calls") or []
        base = {k: v for k, v in m.items() if k != "tool_calls"}
        if not calls:
            turns.append(base)
            continue
        text, done = m["content"], 0
        groups: list[list[dict]] = []  # calls made at the same place go in one turn
        for call in calls:
            if groups and groups[-1][0]["at"] == call["at"]:
                groups[-1].append(call)
            else:
                groups.append([call])
        for i, group in enumerate(groups):
            at = min(max(group[0]["at"], done), len(text))
            turn = {**base, "content": text[done:at], "tool_calls": [_call_turn(c) for c in group]}
            if i:
                turn.pop("thinking", None)  # the thinking came before the first call
            turns.append(turn)
            turns += [{"role": "tool", "tool_call_id": c["id"], "name": c["name"],
                       "content": result_for_model(c)} for c in group]  # fmt: skip
            done = at
        if text[done:]:
            turns.append({"role": "assistant", "content": text[done:]})
    return turns


def _call_turn(call: dict) -> dict:
    return {"id": call["id"], "type": "function",
            "function": {"name": call["name"], "arguments": call["arguments"]}}  # fmt: skip


def for_server(turns: list[dict]) -> list[dict]:
    """Turns as an OpenAI-compatible server takes them: role and content, a call's arguments as
    a JSON string, a tool turn with the id of its call (an answer's thinking stays here)."""
    out = []
    for t in turns:
        turn = {"role": t["role"], "content": t["content"]}
        if t.get("tool_calls"):
            turn["tool_calls"] = [
                {**c, "function": {**c["function"],
                                   "arguments": json.dumps(c["function"]["arguments"])}}
                for c in t["tool_calls"]
            ]  # fmt: skip
        if t["role"] == "tool":
            turn["tool_call_id"] = t["tool_call_id"]
        out.append(turn)
    return out


class Approvals:
    """The worker waits here for the user's answer to a call (given on the GUI thread): one
    question at a time, opened before it is asked (an always-allowed tool is answered at once),
    answered by `reply`, or given up by Stop (DENY)."""

    def __init__(self):
        self._cond = threading.Condition()
        self._asked: str | None = None
        self._answer: str | None = None

    def open(self, call_id: str) -> None:
        with self._cond:
            self._asked, self._answer = call_id, None

    def wait(self, stop: threading.Event) -> str:
        with self._cond:
            while self._answer is None and not stop.is_set():
                self._cond.wait(0.1)
            self._asked = None
            return self._answer or DENY

    def reply(self, call_id: str, answer: str) -> None:
        with self._cond:
            if self._asked == call_id:
                self._answer = answer
                self._cond.notify_all()
