"""Export, grown (issue 24): Markdown of the branch on screen; JSON with the model, the settings,
every branch and each answer's statistics; a self-contained HTML page with code highlighted, which
headless Chromium opens and shows."""

import json
import os
import shutil
import subprocess

import pytest
from app_helpers import answer, open_window
from PySide6.QtGui import QImage

from kwker.app.export import export
from kwker.app.store import Store

CODE_ANSWER = "Here it is:\n\n```python\ndef area(r):\n    return 3.14159 * r * r\n```\n"


def branched(tmp_path) -> tuple[Store, int]:
    """A conversation with two versions of its answer (the second on screen) and an attachment."""
    store = Store(tmp_path / "chats.db")
    cid = store.new_conversation("Circles").id
    q = store.add_message(cid, "user", "Write a function for the area of a circle.")
    first = store.add_message(cid, "assistant", "Use pi r squared.")
    store.update_message(first.id, first.content, stats={"tokens_per_s": 50.0, "speedup": 1.0})
    store.set_leaf(cid, q.id)
    second = store.add_message(cid, "assistant", CODE_ANSWER)
    store.update_message(second.id, CODE_ANSWER, stats={"tokens_per_s": 80.0, "speedup": 2.5})
    store.add_attachment(cid, "notes.md", "circles are round", 4)
    return store, cid


def test_markdown_json_and_html_of_a_branched_conversation(tmp_path):
    store, cid = branched(tmp_path)
    model = {"model": "HuggingFaceTB/SmolLM2-135M-Instruct", "precision": "int4"}
    settings = {"temperature": 0.0, "lookup": True}
    md = export(store, cid, "md", model, settings)
    assert md.startswith("# Circles") and "Attached: notes.md" in md
    assert "**Assistant (version 2 of 2):**" in md and "def area(r):" in md
    assert "pi r squared" not in md  # the branch on screen only

    data = json.loads(export(store, cid, "json", model, settings))
    assert data["model"] == model and data["settings"] == settings
    assert data["attachments"] == [{"name": "notes.md", "tokens": 4}]
    by_id = {m["id"]: m for m in data["messages"]}
    assert [m["content"] for m in data["messages"]] == [
        "Write a function for the area of a circle.",
        "Use pi r squared.",
        CODE_ANSWER,
    ]  # fmt: skip: every branch
    q, first, second = data["messages"]
    assert first["parent_id"] == second["parent_id"] == q["id"] and q["parent_id"] is None
    assert first["stats"]["tokens_per_s"] == 50.0 and second["stats"]["speedup"] == 2.5
    assert data["branch"] == [q["id"], second["id"]] and set(by_id) == {
        q["id"],
        *data["branch"],
    } | {first["id"]}

    page = export(store, cid, "html", model, settings)
    assert page.startswith("<!DOCTYPE html>") and "<title>Circles</title>" in page
    assert "Write a function for the area of a circle." in page and "version 2 of 2" in page
    # Pygments' inline colours on the code's tokens: the keyword `def`, the number
    assert '<span style="color: #007020; font-weight: bold">def</span>' in page
    assert "3.14159</span>" in page
    assert "2.50× plain decoding" in page  # the answer's statistics line
    for external in ("<script", "<link", "src=", "@import", "url("):  # self-contained
        assert external not in page
    with pytest.raises(ValueError, match="export format"):
        export(store, cid, "docx", model, settings)


def chromium() -> str | None:
    return next(
        (
            shutil.which(n)
            for n in ("chromium", "chromium-browser", "google-chrome")
            if shutil.which(n)
        ),
        None,
    )


def screenshot(page, png, size=(1100, 900)) -> QImage:
    """Chromium's rendering of the HTML file `page`, as an image (headless, no GPU; --no-sandbox:
    these machines run tests as root, which Chromium's sandbox refuses)."""
    subprocess.run(
        [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         f"--screenshot={png}", f"--window-size={size[0]},{size[1]}", page.as_uri()],
        check=True, capture_output=True, timeout=120, env={**os.environ, "HOME": str(png.parent)},
    )  # fmt: skip
    image = QImage(str(png))
    assert not image.isNull() and (image.width(), image.height()) == size
    return image


def colours(image: QImage, step: int = 4) -> dict[int, int]:
    counts: dict[int, int] = {}
    for y in range(0, image.height(), step):
        for x in range(0, image.width(), step):
            rgb = image.pixel(x, y) & 0xFFFFFF
            counts[rgb] = counts.get(rgb, 0) + 1
    return counts


@pytest.mark.slow
@pytest.mark.skipif(chromium() is None, reason="no chromium binary to open the HTML export with")
def test_the_html_export_opens_in_headless_chromium_and_shows_the_messages(
    qtbot, data_dir, tmp_path
):
    win = open_window(qtbot, {"max_new_tokens": 60})
    answer(qtbot, win, "Write a Python function that returns the square of a number.")
    win.branches.regenerate()  # a second version: the page shows the one on screen, the JSON both
    qtbot.waitUntil(lambda: not win.generating, timeout=60_000)
    shown = win.messages[-1]
    assert "def " in shown.content  # a code block to highlight
    page, data = tmp_path / "chat.html", tmp_path / "chat.json"
    win.export_to(str(page), "html")
    win.export_to(str(data), "json")
    text = page.read_text(encoding="utf-8")
    assert "Write a Python function that returns the square of a number." in text
    assert 'font-weight: bold">def</span>' in text  # highlighted
    exported = json.loads(data.read_text(encoding="utf-8"))
    assert exported["model"]["model"] == win.model_info["model"]
    assert exported["settings"]["max_new_tokens"] == 60
    answers = [m for m in exported["messages"] if m["role"] == "assistant"]
    assert len(answers) == 2 and all(m["stats"]["new_tokens"] > 0 for m in answers)

    png = tmp_path / "chat.png"
    image = screenshot(page, png)
    shutil.copy(png, "/tmp/issue24-html-export.png")
    counts = colours(image)
    white = counts.get(0xFFFFFF, 0)
    assert white < 0.95 * sum(counts.values()), "the page rendered blank"
    # the user's bubble (#ddf4ff), the answer's (#f6f8fa) and text: the styled messages are drawn
    for bubble in (0xDDF4FF, 0xF6F8FA):
        assert counts.get(bubble, 0) > 200, f"no {bubble:06x} area: {sorted(counts.items())[:20]}"
    assert len(counts) > 30  # text's antialiased edges, the highlighted code's colours
