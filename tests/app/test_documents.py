"""Chat with documents (issue 24): .txt, .md, .pdf (its text layer, pypdf) and source files attached
to a conversation; the whole text goes in when it fits beside the chat, else the chunks BM25 ranks
best against the question; the answer cites what it was given; prompt lookup makes a quoting answer
fast."""

import statistics

import pytest
from app_helpers import answer, open_window
from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
from PySide6.QtGui import QDropEvent

from kwker.app.documents import DocumentError, build_context, chunks, rank, read_document

FACT = "The lighthouse keeper's cat is named Biscuit-7431."
QUESTION = "What is the name of the lighthouse keeper's cat?"
ABOUT_GULL_POINT = [
    "The lighthouse at Gull Point was built in 1887 and stands 31 metres tall. Its lamp can be "
    "seen from 40 kilometres away on a clear night.",
    f"{FACT} She sleeps beside the lamp and catches mice in the storeroom.",
    "Supplies arrive by boat every second Tuesday, weather permitting.",
]
# Filler with its own words (no "lighthouse", "keeper", "cat" or "name"): a document many times
# larger than a small context, in which one chunk holds the fact
TOWNS = ["Arden", "Bexley", "Corran", "Dunmore", "Elstow", "Farrow", "Glenmar", "Hollin", "Ivybridge",
         "Jarrow", "Kilbride", "Lomond", "Marlow", "Norham", "Oakley", "Penrith", "Quarry Bank",
         "Rydal", "Selby", "Thirsk"]  # fmt: skip
GOODS = [
    "wool",
    "barley",
    "copper pots",
    "honey",
    "slate",
    "rope",
    "cider",
    "linen",
    "cheese",
    "tin",
]


def filler(n: int) -> list[str]:
    return [
        f"The market of {TOWNS[i % 20]} opens at {6 + i % 5} o'clock and sells "
        f"{GOODS[i % 10]} and {GOODS[(3 * i + 1) % 10]}. Its square holds {40 + i} stalls, and "
        f"the mayor of {TOWNS[i % 20]} rings a bell when trading ends in the evening."
        for i in range(n)
    ]


def write_pdf(path, paragraphs: list[str]) -> None:
    """A PDF with a text layer (reportlab's Platypus lays the paragraphs out on pages)."""
    from reportlab.lib.pagesizes import A4
    from reportlab.lib.styles import getSampleStyleSheet
    from reportlab.platypus import Paragraph, SimpleDocTemplate, Spacer

    style = getSampleStyleSheet()["BodyText"]
    story = []
    for p in paragraphs:
        story += [Paragraph(p, style), Spacer(1, 12)]
    SimpleDocTemplate(str(path), pagesize=A4).build(story)


def count_words(text: str) -> int:
    return len(text.split())


# ------------------------------------------------------------------------------- reading, ranking
def test_text_markdown_source_and_pdf_files_are_read(tmp_path):
    (tmp_path / "a.txt").write_text("plain text\r\nline two", encoding="utf-8")
    (tmp_path / "b.md").write_text("# Title\n\nSome *text*.", encoding="utf-8")
    (tmp_path / "c.py").write_text("def f():\n    return 42\n", encoding="utf-8")
    write_pdf(tmp_path / "d.pdf", ABOUT_GULL_POINT)
    assert read_document(tmp_path / "a.txt") == "plain text\nline two"
    assert read_document(tmp_path / "b.md") == "# Title\n\nSome *text*."
    assert read_document(tmp_path / "c.py") == "def f():\n    return 42"
    pdf = " ".join(read_document(tmp_path / "d.pdf").split())
    assert FACT in pdf and "every second Tuesday" in pdf


def test_a_file_without_text_is_refused_with_the_reason(tmp_path):
    (tmp_path / "x.bin").write_bytes(b"\x00\x01\x02" * 10)
    (tmp_path / "empty.txt").write_text("  \n")
    write_pdf(tmp_path / "blank.pdf", [])
    (tmp_path / "broken.pdf").write_bytes(b"%PDF-1.4 not really")
    for name, reason in (
        ("x.bin", "binary"), ("empty.txt", "no text"), ("blank.pdf", "no text layer"),
        ("broken.pdf", "not a readable PDF"), ("missing.txt", "not a file"),
    ):  # fmt: skip
        with pytest.raises(DocumentError, match=reason):
            read_document(tmp_path / name)


def test_chunks_keep_paragraphs_and_bm25_finds_the_one_with_the_fact():
    text = "\n\n".join(filler(30) + [ABOUT_GULL_POINT[1]] + filler(30)[::-1])
    parts = chunks(text)
    assert all(len(p) <= 900 for p in parts) and len(parts) > 10
    assert "".join("".join(parts).split()) == "".join(text.split())  # nothing lost
    best = rank(QUESTION, parts)[0]
    assert FACT in parts[best]
    assert rank("the of and", parts) == list(range(len(parts)))  # stopwords only: in order


def test_whole_documents_when_they_fit_else_the_best_parts_that_fit():
    docs = [{"name": "gull.md", "text": "\n\n".join(ABOUT_GULL_POINT)}]
    small = build_context(docs, QUESTION, budget=500, count=count_words)
    assert small.cited == [
        {"name": "gull.md", "tokens": count_words(docs[0]["text"]), "part": 0, "parts": 1,
         "excerpt": ""}
    ]  # fmt: skip
    assert FACT in small.text and "[gull.md]" in small.text
    big = [{"name": "towns.txt", "text": "\n\n".join(filler(40))}, *docs]
    context = build_context(big, QUESTION, budget=400, count=count_words)
    # only the part that shares words with the question: the towns' would take room for nothing
    assert context.cited == [
        {"name": "gull.md", "tokens": count_words(docs[0]["text"]), "part": 1, "parts": 1,
         "excerpt": "The lighthouse at Gull Point was built in…"}
    ]  # fmt: skip
    assert FACT in context.text and "[gull.md, part 1 of 1]" in context.text
    # a question that names nothing in them: their beginnings, as many parts as fit
    summary = build_context(big, "Summarise this.", budget=400, count=count_words)
    assert [(c["name"], c["part"]) for c in summary.cited] == [("towns.txt", 1), ("towns.txt", 2)]
    assert sum(c["tokens"] for c in summary.cited) <= 400


# -------------------------------------------------------------------------------- the real window
@pytest.mark.slow
def test_an_attached_pdf_s_fact_is_in_the_answer(qtbot, data_dir, tmp_path):
    pdf = tmp_path / "gull-point.pdf"
    write_pdf(pdf, ABOUT_GULL_POINT)
    win = open_window(qtbot, {"max_new_tokens": 40})
    assert win.attach([str(pdf)]) == ["gull-point.pdf"]
    (attached,) = win.store.attachments(win.cid)
    assert 60 < attached.tokens < 120  # counted with the model's tokenizer
    chip = win.attachments_row.itemAt(0).widget()
    assert chip.text() == f"gull-point.pdf · {attached.tokens} tokens"
    msg = answer(qtbot, win, QUESTION)
    assert "Biscuit-7431" in msg.content, msg.content
    assert msg.stats["documents"] == [
        {"name": "gull-point.pdf", "tokens": attached.tokens, "part": 0, "parts": 1, "excerpt": ""}
    ]
    assert f"From gull-point.pdf (whole, {attached.tokens} tokens)" in win.view.toPlainText()
    assert win.stats.documents.text() == f"gull-point.pdf: whole, {attached.tokens} tokens"
    # the question as the user wrote it is what the conversation keeps
    assert win.messages[0].content == QUESTION
    # kept: a restart shows the attachment, and the next answer still uses it
    cid = win.cid
    win.close()
    again = open_window(qtbot, keep_saved=True)
    assert again.cid == cid and [a.name for a in again.store.attachments(cid)] == ["gull-point.pdf"]
    again.branches.regenerate()
    qtbot.waitUntil(lambda: not again.generating, timeout=60_000)
    assert "Biscuit-7431" in again.messages[-1].content
    again.chat.attachments.detach(attached.id)
    assert again.store.attachments(cid) == [] and again.attachments_row.count() == 0


@pytest.mark.slow
def test_a_document_larger_than_the_context_is_answered_from_the_chunk_with_the_fact(
    qtbot, data_dir, tmp_path
):
    paragraphs = filler(60) + [ABOUT_GULL_POINT[1]] + filler(90)[60:]
    doc = tmp_path / "towns.md"
    doc.write_text("\n\n".join(paragraphs), encoding="utf-8")
    win = open_window(qtbot, {"max_new_tokens": 40, "context_length": 1024})
    win.attach([str(doc)])
    (attached,) = win.store.attachments(win.cid)
    assert attached.tokens > 3 * 1024  # far larger than the context
    assert win.attachments_row.itemAt(0).widget().text().endswith("· by parts")
    msg = answer(qtbot, win, QUESTION)
    parts = chunks(doc.read_text(encoding="utf-8"))
    holding = next(i + 1 for i, p in enumerate(parts) if FACT in p)
    cited = msg.stats["documents"]
    assert 1 <= len(cited) < len(parts)
    assert holding in [c["part"] for c in cited], (holding, cited)
    assert all(c["parts"] == len(parts) for c in cited)
    assert msg.stats["prompt_tokens"] <= 1024
    assert "Biscuit-7431" in msg.content, msg.content
    assert f"towns.md part {holding} of {len(parts)}" in win.view.toPlainText()


@pytest.mark.slow
def test_documents_dropped_on_the_window_are_attached(qtbot, data_dir, tmp_path):
    win = open_window(qtbot)
    source = tmp_path / "lamp.py"
    source.write_text("def lamp_range_km():\n    return 40\n", encoding="utf-8")
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(source))])
    event = QDropEvent(QPointF(10, 10), Qt.CopyAction, mime, Qt.LeftButton, Qt.NoModifier)
    win.dragEnterEvent(event)
    assert event.isAccepted()
    win.dropEvent(event)
    assert [a.name for a in win.store.attachments(win.cid)] == ["lamp.py"]
    assert win.store.attachments(win.cid)[0].text.startswith("def lamp_range_km")


QUOTE = "Quote the document."


@pytest.mark.slow
def test_prompt_lookup_makes_quoting_a_document_fast(qtbot, data_dir, tmp_path):
    """Answers that quote the attached document, with prompt lookup and with plain decoding,
    alternating: the same greedy text, and lookup gives it in under half the decode steps. The
    rates and the speedup the answer measures inside itself are printed (the issue's figures);
    they are not asserted: a timed assertion on this shared host flaked at 1.28x against a bar of
    1.3x, where the same test alone reads ~1.8x. Speed is measured by `kwker bench`."""
    doc = tmp_path / "gull.md"
    paragraphs = [
        ABOUT_GULL_POINT[0],
        "The keeper climbs the 114 steps of the tower twice a night to wind the clockwork that "
        "turns the lens, and writes the state of the sea, the wind and the lamp in the logbook "
        "that has been kept in the watch room since the first keeper arrived.",
        ABOUT_GULL_POINT[2],
    ]
    doc.write_text("\n\n".join(paragraphs), encoding="utf-8")
    win = open_window(qtbot, {"max_new_tokens": 120, "precision": "int4"})
    rates, steps = {True: [], False: []}, {True: [], False: []}
    inside, texts = [], set()
    for lookup in (True, False) * 3:
        win.apply_settings({**win.settings_panel.values(), "lookup": lookup}, False)
        win.new_chat()
        win.attach([str(doc)])
        msg = answer(qtbot, win, QUOTE)
        texts.add(msg.content)
        rates[lookup].append(msg.stats["tokens_per_s"])
        steps[lookup].append(msg.stats["steps"])
        assert win.stats.documents.text().startswith("gull.md: whole")
        if lookup:
            assert msg.stats["accepted"]["lookup"] > 40, (msg.content, msg.stats)
            inside.append(msg.stats["speedup"])
            shown = f"{msg.stats['speedup']:.2f}×" if msg.stats["speedup"] else "–"
            assert win.stats.speedup.text() == shown
        else:
            # plain: a token a decode step (the prefill gives the first)
            assert msg.stats["steps"] == msg.stats["new_tokens"] - 1
    assert len(texts) == 1  # exact: the same text with and without lookup
    assert "114 steps of the tower" in texts.pop()  # it quotes
    lookup_rate, plain_rate = (statistics.median(rates[m]) for m in (True, False))
    print(f"quoting a document: lookup {lookup_rate:.1f} tokens/s, plain {plain_rate:.1f} "
          f"tokens/s -> {lookup_rate / plain_rate:.2f}x; measured inside the answers: "
          f"{inside}; decode steps {steps}")  # fmt: skip
    # the same answer in under half the steps: each lookup step gave more than two tokens
    assert max(steps[True]) * 2 < min(steps[False]), steps
