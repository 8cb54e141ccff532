"""A conversation as a file: Markdown (the branch on screen), JSON (everything: the model, the
settings, every branch and each answer's statistics) and a self-contained HTML page (the branch on
screen, code highlighted with Pygments when it is installed, no external resources). A thinking
model's thinking goes with its answer: a closed <details> block above it in Markdown and HTML, a
"thinking" field in JSON. So do an answer's tool calls: a closed <details> block each, where it
was made in the text, with its arguments and whole result; a "tool_calls" field in JSON."""

from __future__ import annotations

import html
import json
import time

from markdown_it import MarkdownIt

from kwker.app.store import Store

FORMATS = {"md": "Markdown", "json": "JSON", "html": "HTML"}
WHO = {"user": "You", "assistant": "Assistant", "system": "System"}


def export(store: Store, cid: int, fmt: str, model: dict | None, settings: dict) -> str:
    """The text of conversation `cid` in format `fmt` (a key of FORMATS). model: what the window
    shows about the loaded model (None before one loaded); settings: the conversation's own."""
    if fmt == "md":
        return to_markdown(store, cid)
    if fmt == "json":
        return to_json(store, cid, model, settings)
    if fmt == "html":
        return to_html(store, cid, model)
    raise ValueError(f"export format must be one of {sorted(FORMATS)}, got {fmt!r}")


def to_markdown(store: Store, cid: int) -> str:
    conv = store.conversation(cid)
    parts = [f"# {conv.title}\n"]
    names = [a.name for a in store.attachments(cid)]
    if names:
        parts.append("Attached: " + ", ".join(names) + "\n")
    for m in store.messages(cid):
        versions = f" (version {m.version} of {m.versions})" if m.versions > 1 else ""
        thinking = ""
        if m.thinking:  # HTML in Markdown: the thinking folded, as the app shows it
            thinking = (
                f"<details><summary>Thinking{_about(m.stats)}</summary>\n\n"
                f"{html.escape(m.thinking)}\n\n</details>\n\n"
            )
        text = _with_calls(m, lambda t: t, _call_markdown)
        parts.append(f"**{WHO.get(m.role, m.role)}{versions}:**\n\n{thinking}{text}\n")
    return "\n".join(parts)


def to_json(store: Store, cid: int, model: dict | None, settings: dict) -> str:
    """Every message of every branch (each names its parent: null at the root), which of them are
    on screen (`branch`), and the statistics each answer was given."""
    conv = store.conversation(cid)
    return json.dumps(
        {
            "title": conv.title,
            "exported": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "model": model or {},
            "settings": settings,
            "attachments": [{"name": a.name, "tokens": a.tokens} for a in store.attachments(cid)],
            "branch": [m.id for m in store.messages(cid)],
            "messages": [
                {
                    "id": m.id,
                    "parent_id": m.parent_id,
                    "role": m.role,
                    "content": m.content,
                    "thinking": m.thinking,
                    "tool_calls": m.tool_calls,
                    "created": m.created,
                    "complete": m.complete,
                    "stats": m.stats,
                }
                for m in store.tree(cid)
            ],
        },
        indent=2,
        ensure_ascii=False,
    )


def _with_calls(m, text, call) -> str:
    """An answer's text (each part through `text`) with its tool calls (through `call`) where
    they were made."""
    from kwker.app.render import segments

    parts = segments(m.content, m.tool_calls)
    return "".join(call(p) if isinstance(p, dict) else text(m.content[p[0] : p[1]]) for p in parts)


def _call_summary(call: dict) -> str:
    from kwker.app.render import TOOL_STATUS

    where = f"{call['server']} · {call['tool']}" if call.get("server") else call["name"]
    return f"Tool call: {where} ({TOOL_STATUS.get(call['status'], call['status'])})"


def _call_parts(call: dict) -> tuple[str, str, str]:
    """A call's summary line, arguments (JSON) and result, escaped for HTML: both exports show
    them in a <details> block, Markdown's being HTML too."""
    args = json.dumps(call.get("arguments", {}), indent=2, ensure_ascii=False)
    return tuple(html.escape(t) for t in (_call_summary(call), args, call.get("result", "")))


def _call_markdown(call: dict) -> str:
    summary, args, result = _call_parts(call)
    return (
        f"\n\n<details><summary>{summary}</summary>\n\n"
        f"Arguments:\n\n<pre>{args}</pre>\n\nResult:\n\n<pre>{result}</pre>\n\n</details>\n\n"
    )


def _call_html(call: dict) -> str:
    summary, args, result = _call_parts(call)
    return (
        f'<details class="toolcall"><summary>{summary}</summary>'
        f"<p>Arguments</p><pre>{args}</pre><p>Result</p><pre>{result}</pre></details>"
    )


def _about(stats: dict) -> str:
    """ " (120 tokens · 3.4 s)": a thinking's length and time, "" without figures."""
    from kwker.app.render import thinking_about

    about = thinking_about(stats)
    return f" ({about})" if about else ""


# ------------------------------------------------------------------------------------------- HTML
def _highlighter():
    """Pygments' highlighting for markdown-it's fences (inline styles: the page needs no
    stylesheet of Pygments'), or None when Pygments is not installed (plain code blocks)."""
    try:
        from pygments import highlight
        from pygments.formatters import HtmlFormatter
        from pygments.lexers import get_lexer_by_name, guess_lexer
        from pygments.util import ClassNotFound
    except ImportError:
        return None
    formatter = HtmlFormatter(nowrap=True, noclasses=True, style="friendly")

    def fence(code: str, lang: str, _attrs) -> str:
        try:
            lexer = get_lexer_by_name(lang) if lang else guess_lexer(code)
        except ClassNotFound:
            return ""  # markdown-it escapes it as plain code
        return highlight(code, lexer, formatter)

    return fence


PAGE_CSS = """
body { font: 16px/1.5 system-ui, sans-serif; max-width: 52em; margin: 2em auto; padding: 0 1em;
       color: #1f2328; background: #ffffff; }
h1 { font-size: 1.6em; border-bottom: 1px solid #d0d7de; padding-bottom: .3em; }
.meta { color: #59636e; font-size: .9em; }
.msg { border-radius: 10px; padding: .6em 1em; margin: 1em 0; }
.msg.user { background: #ddf4ff; border: 1px solid #54aeff; }
.msg.assistant { background: #f6f8fa; border: 1px solid #d0d7de; }
.who { font-weight: 600; margin: 0 0 .3em; }
.versions, .stats { color: #59636e; font-weight: normal; font-size: .85em; }
details.thinking { color: #59636e; border-left: 3px solid #d0d7de; padding-left: .8em;
                   margin: .3em 0 .8em; }
details.thinking summary { cursor: pointer; font-size: .9em; }
details.toolcall { border: 1px solid #d0d7de; border-radius: 6px; padding: .3em .8em;
                   margin: .5em 0; font-size: .9em; }
details.toolcall summary { cursor: pointer; }
pre { background: #f8f8f8; border: 1px solid #d0d7de; border-radius: 6px; padding: .8em;
      overflow-x: auto; }
code { font: .9em ui-monospace, monospace; }
table { border-collapse: collapse; } td, th { border: 1px solid #d0d7de; padding: .2em .6em; }
"""


def to_html(store: Store, cid: int, model: dict | None = None) -> str:
    """One page with its style inside: the branch on screen, Markdown rendered, code highlighted."""
    from kwker.app.render import stats_line

    md = MarkdownIt("commonmark", {"html": False, "highlight": _highlighter()})
    md.enable("table").enable("strikethrough")
    conv = store.conversation(cid)
    meta = []
    if model:
        meta.append(f"Model: {html.escape(str(model.get('model', '')))}")
    names = [a.name for a in store.attachments(cid)]
    if names:
        meta.append("Attached: " + html.escape(", ".join(names)))
    parts = []
    for m in store.messages(cid):
        versions = (
            f' <span class="versions">version {m.version} of {m.versions}</span>'
            if m.versions > 1
            else ""
        )
        if m.role == "user":  # what the user typed, as typed
            body = f"<p>{html.escape(m.content).replace(chr(10), '<br>')}</p>"
        else:
            body = _with_calls(m, md.render, _call_html)
        if m.thinking:
            text = html.escape(m.thinking).replace(chr(10), "<br>")
            body = (
                f'<details class="thinking"><summary>Thinking{html.escape(_about(m.stats))}'
                f"</summary><p>{text}</p></details>{body}"
            )
        stats = stats_line(m.stats) if m.role == "assistant" else ""
        stats_html = f'<p class="stats">{html.escape(stats)}</p>' if stats else ""
        parts.append(
            f'<div class="msg {html.escape(m.role)}"><p class="who">'
            f"{html.escape(WHO.get(m.role, m.role))}{versions}</p>{body}{stats_html}</div>"
        )
    title = html.escape(conv.title)
    meta_html = f'<p class="meta">{" · ".join(meta)}</p>' if meta else ""
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{title}</title><style>{PAGE_CSS}</style></head>\n"
        f"<body><h1>{title}</h1>{meta_html}\n" + "\n".join(parts) + "\n</body></html>\n"
    )
