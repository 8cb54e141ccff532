"""Messages as HTML for the chat view: Markdown (markdown-it) with code blocks that carry a Copy link, a Copy link
per message, an Edit link on user messages, and optional tinting of the tokens that came from speculation."""

from __future__ import annotations

import html
import re

from markdown_it import MarkdownIt

_md = MarkdownIt("commonmark", {"html": False}).enable("table").enable("strikethrough")
_CODE = re.compile(r"<pre><code( class=\"[^\"]*\")?>(.*?)</code></pre>", re.S)


def markdown_html(text: str, code_blocks: list[str]) -> str:
    """HTML of text; each code block gets a Copy link (copy-code:N) and its source is appended to code_blocks."""

    def block(m):
        code = html.unescape(m.group(2))
        code_blocks.append(code)
        lang = (m.group(1) or "").replace(' class="language-', "").rstrip('"')
        head = f'<span class="lang">{html.escape(lang)}</span> ' if lang else ""
        return (
            f'<table class="code" width="100%" cellspacing="0" cellpadding="6"><tr><td class="codehead">{head}'
            f'<a href="copy-code:{len(code_blocks) - 1}">Copy</a></td></tr><tr><td class="codebody"><pre>'
            f"{m.group(2)}</pre></td></tr></table>"
        )

    return _CODE.sub(block, _md.render(text))


def tinted_html(pieces: list[tuple[str, str]], colors: dict[str, str]) -> str:
    """Plain text with the pieces that came from a speculation source on that source's colour."""
    out = []
    for text, source in pieces:
        t = html.escape(text).replace("\n", "<br>")
        out.append(f'<span style="background-color:{colors[source]}">{t}</span>' if source else t)
    return "".join(out)


def message_html(index: int, role: str, body_html: str, editable: bool, note: str = "") -> str:
    links = [f'<a href="copy-msg:{index}">Copy</a>']
    if editable:
        links.append(f'<a href="edit-msg:{index}">Edit</a>')
    who = {"user": "You", "assistant": "Assistant", "system": "System"}.get(role, role)
    note_html = f' <span class="note">{html.escape(note)}</span>' if note else ""
    return (
        f'<div class="msg {role}"><p class="who"><b>{who}</b>{note_html} &nbsp; '
        f'<span class="links">{" · ".join(links)}</span></p>{body_html}</div>'
    )
