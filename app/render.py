"""Messages as HTML for the chat view: Markdown (markdown-it) with code blocks that carry a Copy
link, a Copy link per message, an Edit link on user messages, a quiet line of the answer's
statistics, and optional tinting of the text that came from speculation (over the rendered
Markdown)."""

from __future__ import annotations

import html
import json
import re

from markdown_it import MarkdownIt

_md = MarkdownIt("commonmark", {"html": False}).enable("table").enable("strikethrough")
_CODE = re.compile(r"<pre><code( class=\"[^\"]*\")?>(.*?)</code></pre>", re.S)
_TAG = re.compile(r"(<[^>]*>)")
# How far ahead in the source a rendered character is looked for (Markdown syntax, a link's URL)
# before it is taken as one the renderer made up
_LOOKAHEAD = 400

SOURCE_NAMES = {"lookup": "prompt lookup", "draft": "the draft model"}


def add_run(runs: list, text: str, source: str) -> None:
    """Appends text's characters to runs ([[characters, source], ...]), merging a run of the same
    source."""
    if not text:
        return
    if runs and runs[-1][1] == source:
        runs[-1][0] += len(text)
    else:
        runs.append([len(text), source])


def tint(rendered: str, text: str, runs: list, colors: dict[str, str]) -> str:
    """`rendered` (the HTML of Markdown `text`) with the characters that came from a speculation
    source (runs over text, see add_run) on that source's colour. Each rendered character is matched
    to the next equal character of the source (what Markdown drops, its syntax, is skipped), so the
    tint follows the text through emphasis, lists and code blocks."""
    labels = [source for n, source in runs for _ in range(n)]
    labels += [""] * (len(text) - len(labels))
    out, j = [], 0
    for part in _TAG.split(rendered):
        if part.startswith("<") or not part.strip():
            out.append(part)  # a tag, or the whitespace between blocks
            continue
        groups: list[list] = []  # [source, characters]
        for ch in html.unescape(part):
            found = text.find(ch, j, j + _LOOKAHEAD)
            source = ""
            if found >= 0:
                source, j = labels[found], found + 1
            if groups and groups[-1][0] == source:
                groups[-1][1].append(ch)
            else:
                groups.append([source, [ch]])
        for source, chars in groups:
            piece = html.escape("".join(chars), quote=False)
            out.append(
                f'<span style="background-color:{colors[source]}">{piece}</span>'
                if source
                else piece
            )
    return "".join(out)


def markdown_html(
    text: str, code_blocks: list[str], runs: list | None = None, colors: dict | None = None
) -> str:
    """HTML of text; each code block gets a Copy link (copy-code:N) and its source is appended to
    code_blocks. With runs (see add_run) and the theme's colors, speculated text is tinted."""

    def block(m):
        code = html.unescape(_TAG.sub("", m.group(2)))  # without the tint's spans
        code_blocks.append(code)
        lang = (m.group(1) or "").replace(' class="language-', "").rstrip('"')
        head = f'<span class="lang">{html.escape(lang)}</span> ' if lang else ""
        return (
            f'<table class="code" width="100%" cellspacing="0" cellpadding="6"><tr><td class="codehead">{head}'
            f'<a href="copy-code:{len(code_blocks) - 1}">Copy</a></td></tr><tr><td class="codebody"><pre>'
            f"{m.group(2)}</pre></td></tr></table>"
        )

    rendered = _md.render(text)
    if runs and colors is not None:
        rendered = tint(rendered, text, runs, colors)
    return _CODE.sub(block, rendered)


def stats_line(stats: dict) -> str:
    """One quiet line of an answer's statistics: its rate, its speedup and the accepted tokens."""
    parts = []
    if stats.get("tokens_per_s"):
        # a server that reports no figures: the rate this app saw, said so
        here = " measured here" if stats.get("measured") == "client" else ""
        parts.append(f"{stats['tokens_per_s']:.0f} tokens/s{here}")
    if stats.get("thinking_tokens"):  # a thinking model's share of the answer
        of = f" of {stats['new_tokens']}" if stats.get("new_tokens") else ""
        parts.append(f"{stats['thinking_tokens']}{of} tokens thinking")
    if stats.get("speedup"):
        parts.append(f"{stats['speedup']:.2f}× plain decoding")
    for source, accepted in stats.get("accepted", {}).items():
        proposed = stats.get("proposed", {}).get(source, 0)
        if proposed:
            parts.append(
                f"{accepted} of {proposed} proposed tokens from {SOURCE_NAMES.get(source, source)}"
            )
    if stats.get("error"):  # why the answer ended early (a cut stream, a failure)
        parts.append(stats["error"])
    return " · ".join(parts)


def thinking_about(stats: dict) -> str:
    """ "120 tokens · 3.4 s": a thinking's length and time, from an answer's figures."""
    parts = []
    if stats.get("thinking_tokens"):
        parts.append(f"{stats['thinking_tokens']:,} tokens")
    if stats.get("thinking_s"):
        parts.append(f"{stats['thinking_s']:.1f} s")
    return " · ".join(parts)


def thinking_html(index: int, thinking: str, shown: bool, about: str = "") -> str:
    """A thinking model's thinking above its answer: a "Thinking" line that opens and closes it
    (the link thinking:index), with its length and time, and, when shown, the text, dimmed (plain
    text: the model's scratch work is not rendered as Markdown)."""
    arrow = "▾" if shown else "▸"
    about_html = f' <span class="note">{html.escape(about)}</span>' if about else ""
    head = f'<p class="thinkhead"><a href="thinking:{index}">{arrow} Thinking</a>{about_html}</p>'
    if not shown:
        return head
    body = html.escape(thinking).replace("\n", "<br>")
    table = '<table class="thinking" width="100%" cellpadding="6">'
    return f"{head}{table}<tr><td>{body}</td></tr></table>"


TOOL_STATUS = {
    "asking": "waiting for your approval",
    "running": "running…",
    "done": "done",
    "error": "failed",
    "timeout": "timed out",
    "denied": "denied",
}
TOOL_SHOWN_CHARS = 3000  # what of a result the chat shows (the export has it all)


def tool_call_html(link: str, call: dict, shown: bool) -> str:
    """A tool call in an answer: a "Tool call" line that opens and closes it (the link
    toolcall:link), with the server, the tool and how it went (a failure's reason too), and, when
    shown, its arguments and result (plain text)."""
    arrow = "▾" if shown else "▸"
    status = TOOL_STATUS.get(call["status"], call["status"])
    if call["status"] == "done" and call.get("seconds"):
        status += f" in {call['seconds']:.1f} s"
    if call["status"] in ("error", "timeout"):
        status += f": {_shorten(call.get('result', ''), 200)}"
    where = f"{call['server']} · {call['tool']}" if call.get("server") else call["name"]
    head = (
        f'<p class="toolhead"><a href="toolcall:{link}">{arrow} Tool call</a> '
        f'<b>{html.escape(where)}</b> <span class="note">{html.escape(status)}</span></p>'
    )
    if not shown:
        return head
    args = json.dumps(call.get("arguments", {}), indent=2, ensure_ascii=False)
    result = _shorten(call.get("result", ""), TOOL_SHOWN_CHARS) or "(none yet)"
    return (
        f'{head}<table class="toolcall" width="100%" cellpadding="6"><tr><td>'
        f"<b>Arguments</b><pre>{html.escape(args)}</pre>"
        f"<b>Result</b><pre>{html.escape(result)}</pre></td></tr></table>"
    )


def _shorten(text: str, n: int) -> str:
    return text if len(text) <= n else text[:n] + "…"


def segments(text: str, calls: list[dict]) -> list:
    """An answer's text parted at its tool calls: [(start, end) of text, call, (start, end), …]."""
    out, done = [], 0
    for call in calls:
        at = min(max(call.get("at", len(text)), done), len(text))
        out += [(done, at), call]
        done = at
    return [*out, (done, len(text))]


def slice_runs(runs: list, start: int, end: int) -> list:
    """The runs (see add_run) over text[start:end]."""
    out, pos = [], 0
    for n, source in runs:
        a, b = max(pos, start), min(pos + n, end)
        if b > a:
            add_run(out, "x" * (b - a), source)
        pos += n
    return out


def version_switcher(index: int, version: int, versions: int) -> str:
    """ "< 2/3 >": the message's place among its versions, with links to the one before and after
    (none past either end)."""
    prev = f'<a href="prev-version:{index}">&lt;</a>' if version > 1 else "&lt;"
    after = f'<a href="next-version:{index}">&gt;</a>' if version < versions else "&gt;"
    return f'<span class="versions">{prev} {version}/{versions} {after}</span>'


def citations(cited: list[dict]) -> str:
    """Which of the documents an answer was given (kwker.app.documents' cited list): a whole
    document, or the parts of one that BM25 chose, with the words each part begins with."""
    parts = []
    for c in cited:
        if c["part"] == 0:
            parts.append(f"{c['name']} (whole, {c['tokens']:,} tokens)")
        else:
            parts.append(f"{c['name']} part {c['part']} of {c['parts']} “{c['excerpt']}”")
    return "From " + " · ".join(parts) if parts else ""


def message_html(
    index: int, role: str, body_html: str, editable: bool, note: str = "", stats: str = "",
    version: tuple[int, int] = (1, 1), cites: str = "", continue_link: bool = False,
) -> str:  # fmt: skip
    """A message with its links (Copy, Edit, Fork from here when editable: a finished one) and,
    when it has other versions, its "< 2/3 >" switcher."""
    links = [f'<a href="copy-msg:{index}">Copy</a>']
    if editable and role == "user":
        links.append(f'<a href="edit-msg:{index}">Edit</a>')
    if editable:
        links.append(f'<a href="fork-msg:{index}">Fork from here</a>')
    if version[1] > 1:
        links.insert(0, version_switcher(index, *version))
    who = {"user": "You", "assistant": "Assistant", "system": "System"}.get(role, role)
    note_html = f' <span class="note">{html.escape(note)}</span>' if note else ""
    if continue_link:  # an answer cut at max_new_tokens: "Stopped at N tokens · Continue"
        note_html += ' <span class="note">·</span> <a href="continue:0"><b>Continue</b></a>'

    stats_html = f'<p class="stats">{html.escape(stats)}</p>' if stats else ""
    if cites:
        stats_html = f'<p class="stats">{html.escape(cites)}</p>' + stats_html
    return (
        f'<div class="msg {role}"><p class="who"><b>{who}</b>{note_html} &nbsp; '
        f'<span class="links">{" · ".join(links)}</span></p>{body_html}{stats_html}</div>'
    )
