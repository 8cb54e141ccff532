"""The window's basics with the real model (offscreen): Markdown rendered as rich text, a code
block's and a message's Copy link putting exactly their text on the clipboard (real mouse clicks),
the theme switch (palette and the chat view's pixels), each shortcut by real key events, and an
accessible name on every control."""

import numpy as np
import pytest
from app_helpers import answer, open_window
from PySide6.QtCore import Qt
from PySide6.QtGui import (
    QAccessible,
    QColor,
    QFontMetricsF,
    QImage,
    QPalette,
    QTextCursor,
    QTextListFormat,
)
from PySide6.QtTest import QTest
from PySide6.QtWidgets import (
    QAbstractButton,
    QAbstractItemView,
    QAbstractSlider,
    QAbstractSpinBox,
    QApplication,
    QComboBox,
    QGroupBox,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QScrollBar,
    QTabBar,
    QTextEdit,
    QWidget,
)

from kwker.app.theme import DARK, LIGHT

pytestmark = pytest.mark.slow

MARKDOWN = """# Release notes

Some **bold** words, an *emphasis* and `inline` code.

- one
- two
- three

1. first
2. second

```python
def f(x):
    return x
```

| Name | Size |
|------|------|
| a    | 1    |
| b    | 2    |
"""

# Two code blocks in one answer, one in the next: tabs, blank lines, trailing spaces and HTML's
# special characters must reach the clipboard as they are.
FIRST = (
    "Two snippets:\n\n"
    "```python\n"
    "def f(x):\n"
    '\tif x < 1 and x > -1:\n        return "&amp;"\n'
    "\n"
    "    return x  \n"
    "```\n\n"
    "and\n\n"
    "```bash\necho 'two' && ls *.txt\n```\n"
)
FIRST_CODE = [
    'def f(x):\n\tif x < 1 and x > -1:\n        return "&amp;"\n\n    return x  \n',
    "echo 'two' && ls *.txt\n",
]
SECOND = 'One more:\n\n```\n<div class="x">3 > 2</div>\n```\n'
SECOND_CODE = '<div class="x">3 > 2</div>\n'


def show(qtbot, win):
    """The window on screen and active: shortcuts and focus need an active window."""
    win.show()
    qtbot.waitExposed(win)
    win.activateWindow()
    qtbot.waitUntil(lambda: QApplication.activeWindow() is win, timeout=5_000)


def put(win, *messages):
    """The current conversation with these (role, content) messages, finished, shown."""
    for role, content in messages:
        win.store.add_message(win.cid, role, content)
    win.open_conversation(win.cid)


def fragments_of(block):
    it = block.begin()
    while not it.atEnd():
        yield it.fragment()
        it += 1


def fragments(doc):
    """(block, fragment) for every text fragment of doc, in order."""
    block = doc.begin()
    while block.isValid():
        for frag in fragments_of(block):
            yield block, frag
        block = block.next()


def fragment(doc, text):
    found = [f for _, f in fragments(doc) if f.text() == text]
    assert found, f"no fragment {text!r} in {[f.text() for _, f in fragments(doc)]}"
    return found[0]


def block_with(doc, text):
    found = [b for b, _ in fragments(doc) if b.text() == text]
    assert found, f"no block {text!r}"
    return found[0]


def fixed_pitch(frag) -> bool:
    """Whether the fragment's font gives "i" and "W" the same advance: measured, since Qt's
    fixedPitch() says False for some monospaced fonts (Debian's variable Noto Sans Mono)."""
    metrics = QFontMetricsF(frag.charFormat().font())
    return metrics.horizontalAdvance("i") == metrics.horizontalAdvance("W")


def table_at(doc, position):
    cursor = QTextCursor(doc)
    cursor.setPosition(position)
    return cursor.currentTable()


def cell_texts(table):
    return [
        [table.cellAt(r, c).firstCursorPosition().block().text() for c in range(table.columns())]
        for r in range(table.rows())
    ]


def click_link(qtbot, view, href):
    """A real left click, in the viewport, on the middle of the link to href."""
    links = [f for _, f in fragments(view.document()) if f.charFormat().anchorHref() == href]
    assert len(links) == 1, f"{len(links)} links to {href}"
    cursor = QTextCursor(view.document())
    cursor.setPosition(links[0].position() + links[0].length() // 2)
    view.setTextCursor(cursor)
    view.ensureCursorVisible()  # scrolled into view
    point = view.cursorRect(cursor).center()
    assert view.viewport().rect().contains(point)
    assert view.anchorAt(point) == href  # the point is on the link
    QTest.mouseClick(view.viewport(), Qt.LeftButton, Qt.NoModifier, point)


def pixels(widget) -> np.ndarray:
    """The widget as drawn: height x width x (R, G, B)."""
    image = widget.grab().toImage().convertToFormat(QImage.Format_RGB32)
    h, w = image.height(), image.width()
    raw = np.frombuffer(image.constBits(), np.uint8, count=image.sizeInBytes())
    bgra = raw.reshape(h, image.bytesPerLine())[:, : w * 4].reshape(h, w, 4)
    return bgra[..., [2, 1, 0]].astype(np.float64)


def luminance(rgb: np.ndarray) -> float:
    return float((rgb @ np.array([0.2126, 0.7152, 0.0722])).mean())


def commonest(rgb: np.ndarray) -> str:
    values, counts = np.unique(rgb.reshape(-1, 3).astype(np.uint8), axis=0, return_counts=True)
    return QColor(*(int(v) for v in values[counts.argmax()])).name()


# ----------------------------------------------------------------------------------------- Markdown
def test_markdown_is_rendered_as_rich_text(qtbot, data_dir):
    win = open_window(qtbot, {"theme": "light"})
    show(qtbot, win)
    put(win, ("user", "Write release notes."), ("assistant", MARKDOWN))
    doc = win.view.document()
    plain = win.view.toPlainText()
    for syntax in ("**", "# Release", "```", "`inline`", "|---", "- one", "1. first"):
        assert syntax not in plain  # no Markdown syntax left over

    heading = block_with(doc, "Release notes")
    body = block_with(doc, "Some bold words, an emphasis and inline code.")
    assert heading.blockFormat().headingLevel() == 1
    assert fragment(doc, "Release notes").charFormat().fontWeight() >= 700
    assert heading.layout().lineAt(0).height() > body.layout().lineAt(0).height() * 1.4

    assert fragment(doc, "bold").charFormat().fontWeight() >= 700
    assert fragment(doc, "Some ").charFormat().fontWeight() < 700
    assert fragment(doc, "emphasis").charFormat().fontItalic()
    assert fixed_pitch(fragment(doc, "inline")) and not fixed_pitch(fragment(doc, "Some "))

    bullets = block_with(doc, "one").textList()
    assert bullets is not None and bullets.format().style() == QTextListFormat.ListDisc
    assert [bullets.item(i).text() for i in range(bullets.count())] == ["one", "two", "three"]
    numbered = block_with(doc, "first").textList()
    assert numbered is not None and numbered.format().style() == QTextListFormat.ListDecimal
    assert [numbered.item(i).text() for i in range(numbered.count())] == ["first", "second"]

    # the code block: a table whose head has the language and the Copy link, whose body the code in
    # a monospace font, line by line with its indentation
    code = [block_with(doc, "def f(x):"), block_with(doc, "    return x")]
    assert all(fixed_pitch(f) for b in code for f in fragments_of(b))
    table = table_at(doc, code[0].position())
    assert table is not None and table_at(doc, code[1].position()) == table
    assert (table.rows(), table.columns()) == (2, 1)
    assert cell_texts(table) == [["python Copy"], ["def f(x):"]]
    lang = fragment(doc, "python")
    assert lang.charFormat().foreground().color().name() == LIGHT["muted"]
    copy = [f for _, f in fragments(doc) if f.charFormat().anchorHref() == "copy-code:0"]
    assert [f.text() for f in copy] == ["Copy"] and table_at(doc, copy[0].position()) == table
    assert win.chat.code_blocks == ["def f(x):\n    return x\n"]

    grid = table_at(doc, block_with(doc, "Name").position())
    assert grid is not None and grid != table
    assert cell_texts(grid) == [["Name", "Size"], ["a", "1"], ["b", "2"]]
    assert fragment(doc, "Size").charFormat().fontWeight() >= 700  # the header row


# ------------------------------------------------------------------------------------------ copying
def test_copy_links_put_exactly_the_code_and_the_message_on_the_clipboard(qtbot, data_dir):
    win = open_window(qtbot, {"theme": "light"})
    show(qtbot, win)
    put(
        win,
        ("user", "Show me code."),
        ("assistant", FIRST),
        ("user", "And HTML?"),
        ("assistant", SECOND),
    )
    assert win.chat.code_blocks == [*FIRST_CODE, SECOND_CODE]
    clipboard = QApplication.clipboard()
    # the last one first: each click must copy its own block, not the first or the latest
    for n, expected in reversed(list(enumerate([*FIRST_CODE, SECOND_CODE]))):
        clipboard.setText("(nothing copied)")
        click_link(qtbot, win.view, f"copy-code:{n}")
        assert clipboard.text() == expected
        assert win.status.text() == "Code copied"
    for index, expected in ((1, FIRST), (3, SECOND), (0, "Show me code.")):
        clipboard.setText("(nothing copied)")
        click_link(qtbot, win.view, f"copy-msg:{index}")
        assert clipboard.text() == expected
        assert win.status.text() == "Message copied"


# -------------------------------------------------------------------------------------------- theme
def test_the_dark_theme_from_the_settings_panel_and_back(qtbot, data_dir):
    win = open_window(qtbot, {"theme": "light"})
    show(qtbot, win)
    put(win, ("user", "Hello"), ("assistant", "Hello! Here is some **text** and `code`."))
    roles = {
        QPalette.Window: "window",
        QPalette.Base: "base",
        QPalette.Text: "text",
        QPalette.WindowText: "text",
        QPalette.Button: "base",
        QPalette.ButtonText: "text",
        QPalette.Highlight: "accent",
        QPalette.Link: "accent",
    }

    def assert_theme(colors):
        palette = QApplication.palette()
        for role, key in roles.items():
            assert palette.color(role).name() == colors[key], (role, key)
        assert win.view.palette().color(QPalette.Base).name() == colors["base"]
        # the chat's own style: its text colour, its background as drawn
        assert (
            fragment(win.view.document(), "Hello").charFormat().foreground().color().name()
            == (colors["text"])
        )
        drawn = pixels(win.view.viewport())
        assert commonest(drawn) == colors["base"]
        return luminance(drawn)

    light = assert_theme(LIGHT)
    panel = win.settings_panel

    def choose(theme):
        panel.theme.setCurrentIndex(panel.theme.findData(theme))
        QTest.mouseClick(panel.apply_button, Qt.LeftButton)

    choose("dark")
    dark = assert_theme(DARK)
    assert light > 200 and dark < 70, (light, dark)
    assert win.store.settings()["theme"] == "dark" and win.model_info is not None  # no reload
    choose("light")
    assert abs(assert_theme(LIGHT) - light) < 0.5
    assert win.store.settings()["theme"] == "light"


# ---------------------------------------------------------------------------------------- shortcuts
def test_ctrl_n_starts_a_new_chat_with_the_input_focused(qtbot, data_dir):
    win = open_window(qtbot)
    show(qtbot, win)
    answer(qtbot, win, "Say hello.")
    first = win.cid
    win.search.setFocus()
    QTest.keyClick(win.search, Qt.Key_N, Qt.ControlModifier)
    assert win.cid != first and win.cid in [c.id for c in win.store.conversations()]
    assert win.messages == [] and "Say hello" not in win.view.toPlainText()
    assert QApplication.focusWidget() is win.input
    assert [m.role for m in win.store.messages(first)] == ["user", "assistant"]  # kept


def test_the_window_fits_a_laptop_screen(qtbot, data_dir):
    """A 1366 x 768 screen, less a taskbar, holds the whole window: the long settings form scrolls
    in its tab instead of making the window taller than the screen, and every one of its fields can
    be reached."""
    win = open_window(qtbot)
    show(qtbot, win)
    hint = win.minimumSizeHint()
    assert hint.width() <= 1366 and hint.height() <= 700, hint
    room = win.screen().availableGeometry()
    assert win.width() <= room.width() and win.height() <= room.height()
    win.resize(1000, 640)
    win.tabs.setCurrentWidget(win.settings_tab)
    qtbot.waitUntil(lambda: win.height() <= 640)
    bar = win.settings_tab.verticalScrollBar()
    assert bar.maximum() > 0  # the form is taller than its tab: it scrolls
    win.settings_tab.ensureWidgetVisible(win.settings_panel.system_prompt)
    assert (
        bar.value() > 0
        and win.settings_panel.system_prompt.visibleRegion().boundingRect().height() > 0
    )


def test_ctrl_l_focuses_the_input(qtbot, data_dir):
    win = open_window(qtbot)
    show(qtbot, win)
    for widget in (win.search, win.view, win.settings_panel.temperature):
        win.tabs.setCurrentWidget(win.settings_tab)
        widget.setFocus()
        assert QApplication.focusWidget() is widget
        QTest.keyClick(widget, Qt.Key_L, Qt.ControlModifier)
        assert QApplication.focusWidget() is win.input, type(widget).__name__


def test_enter_sends_and_shift_enter_starts_a_new_line(qtbot, data_dir):
    win = open_window(qtbot)
    show(qtbot, win)
    win.input.setFocus()
    QTest.keyClicks(win.input, "Name a colour.")
    QTest.keyClick(win.input, Qt.Key_Return, Qt.ShiftModifier)
    QTest.keyClicks(win.input, "Just one.")
    assert win.input.toPlainText() == "Name a colour.\nJust one." and not win.generating
    assert win.store.messages(win.cid) == []
    QTest.keyClick(win.input, Qt.Key_Return)
    assert win.generating and win.input.toPlainText() == ""
    assert win.store.messages(win.cid)[0].content == "Name a colour.\nJust one."
    qtbot.waitUntil(lambda: not win.generating, timeout=120_000)
    assert win.messages[-1].role == "assistant" and win.messages[-1].content
    QTest.keyClicks(win.input, "And a fruit?")
    QTest.keyClick(win.input, Qt.Key_Enter, Qt.KeypadModifier)  # the keypad's Enter too
    assert win.generating and win.store.messages(win.cid)[2].content == "And a fruit?"
    qtbot.waitUntil(lambda: not win.generating, timeout=120_000)
    assert [m.role for m in win.messages] == ["user", "assistant"] * 2


def test_esc_stops_a_streaming_answer(qtbot, data_dir):
    win = open_window(qtbot, {"max_new_tokens": 400})
    show(qtbot, win)
    win.input.setFocus()
    QTest.keyClicks(win.input, "Write a long story about a lighthouse keeper.")
    QTest.keyClick(win.input, Qt.Key_Return)
    qtbot.waitUntil(lambda: len(win.stream_text) > 40, timeout=60_000)
    assert QApplication.focusWidget() is win.input
    QTest.keyClick(win.input, Qt.Key_Escape)
    qtbot.waitUntil(lambda: not win.generating, timeout=10_000)
    msg = win.messages[-1]
    assert msg.stats["finish_reason"] == "stopped" and msg.stats["new_tokens"] < 400
    assert len(msg.content) >= 40 and "(stopped)" in win.view.toPlainText()


def test_ctrl_r_regenerates_the_last_answer(qtbot, data_dir):
    win = open_window(qtbot)  # greedy: the same answer again
    show(qtbot, win)
    first = answer(qtbot, win, "Name a colour.")
    streamed = []
    win.worker.chunk.connect(lambda text, *_: streamed.append(text))
    win.input.setFocus()
    with qtbot.waitSignal(win.worker.finished, timeout=120_000):
        QTest.keyClick(win.input, Qt.Key_R, Qt.ControlModifier)
        assert win.generating
    qtbot.waitUntil(lambda: not win.generating, timeout=10_000)
    again = win.messages[-1]
    assert [m.role for m in win.messages] == ["user", "assistant"]  # replaced, not added
    assert again.complete and again.content == first.content
    assert "".join(streamed) == first.content  # written again, token by token


def test_ctrl_q_quits(qtbot, data_dir):
    win = open_window(qtbot)
    show(qtbot, win)
    win.input.setFocus()
    QTest.keyClick(win.input, Qt.Key_Q, Qt.ControlModifier)
    qtbot.wait(200)
    quit_keys = [a.shortcut().toString() for a in win.actions() if a.text() == "Quit"]
    assert not win.isVisible(), f"Ctrl+Q left the window open (the Quit action's keys: {quit_keys})"
    assert (
        win.model_choice.thread_.isFinished()
    )  # closed the way closeEvent does it: the worker's thread ended


# --------------------------------------------------------------------------------- accessible names
INTERACTIVE = (
    QAbstractButton,
    QLineEdit,
    QPlainTextEdit,
    QTextEdit,
    QComboBox,
    QAbstractSpinBox,
    QAbstractItemView,
    QAbstractSlider,
    QTabBar,
)
# Internal parts of another control, which a screen reader presents as that control: the QLineEdit
# of a spin box or an editable combo box, a combo box's popup list, an item view's headers, corner
# button and cell editors (each reached through the view's own accessible table or list).
COMPOSITES = (QAbstractSpinBox, QComboBox, QAbstractItemView)


def internal_part(widget, top) -> bool:
    if isinstance(widget, QScrollBar):
        return True  # a scroll area's scroll bars: part of the area, which has the name
    parent = widget.parentWidget()
    while parent is not None and parent is not top:
        if isinstance(parent, COMPOSITES):
            return True
        parent = parent.parentWidget()
    return False


def accessible_name(widget) -> str:
    """What a screen reader announces as the control's name (Qt's accessibility interface)."""
    iface = QAccessible.queryAccessibleInterface(widget)
    name = iface.text(QAccessible.Name).strip()
    labels = [
        other.text(QAccessible.Name).strip()
        for other, _ in iface.relations(QAccessible.Label)
        if isinstance(other.object(), QLabel)
    ]
    if isinstance(widget, QComboBox):
        # on Unix Qt reports a combo box's current text (its value) as its name and gives its label
        # as a relation; elsewhere the name is its accessible name or its label's: require one
        return widget.accessibleName().strip() or next((t for t in labels if t), "")
    box = widget.parentWidget()
    if (
        isinstance(box, QGroupBox)
        and name == box.title().strip()
        and not widget.accessibleName()
        and not any(labels)
        and not (isinstance(widget, QAbstractButton) and widget.text().strip())
    ):
        return ""  # Qt's last resort, the group box's title: it names the group, not the control
    return name


def describe(widget, top) -> str:
    chain, parent = [], widget.parentWidget()
    while parent is not None:
        chain.append(
            type(parent).__name__ + (f"#{parent.objectName()}" if parent.objectName() else "")
        )
        if parent is top:
            break
        parent = parent.parentWidget()
    shows = ""
    if isinstance(widget, QComboBox):
        shows = f" showing {widget.currentText()!r}"
    elif isinstance(widget, QLineEdit) and widget.placeholderText():
        shows = f" placeholder {widget.placeholderText()!r}"
    return f"{type(widget).__name__} {widget.objectName()!r}{shows} in {' < '.join(chain)}"


def unnamed_controls(top):
    controls = [w for w in top.findChildren(QWidget) if isinstance(w, INTERACTIVE)]
    checked = [w for w in controls if not internal_part(w, top)]
    return checked, [describe(w, top) for w in checked if not accessible_name(w)]


def test_every_control_of_the_window_and_its_panels_has_an_accessible_name(qtbot, data_dir):
    win = open_window(qtbot)
    show(qtbot, win)
    checked, unnamed = unnamed_controls(win)
    panel = win.settings_panel
    for widget in (win.input, win.send_button, win.conv_list, win.view, panel.theme):
        assert widget in checked  # the walk reached the window, its side panel and the settings
    assert panel.apply_button in checked and panel.max_new_tokens in checked
    assert win.isAncestorOf(win.stats)  # walked too (labels and a chart: nothing to name today)
    assert not unnamed, "controls without an accessible name:\n" + "\n".join(unnamed)


def test_every_control_of_the_model_picker_has_an_accessible_name(qtbot, data_dir):
    win = open_window(qtbot)
    picker = win.model_choice.open_picker()
    qtbot.addWidget(picker)
    qtbot.waitExposed(picker)
    checked, unnamed = unnamed_controls(picker)
    assert (
        picker.table in checked and picker.search in checked and picker.download_button in checked
    )
    assert not unnamed, "model picker controls without an accessible name:\n" + "\n".join(unnamed)


def test_the_about_box_shows_the_license_and_the_notices(qtbot, data_dir):
    win = open_window(qtbot)
    about = win.open_about()
    qtbot.addWidget(about)
    text = about.text.toPlainText()
    assert "Apache License 2.0" in about.findChild(QLabel).text()
    lines = {line.split(" ")[0]: line for line in text.splitlines() if ": " in line}
    assert "LGPL-3.0" in lines["PySide6_Essentials"]  # Qt for Python, as its metadata says
    assert "BSD-3-Clause" in lines["numpy"]


@pytest.mark.slow
def test_the_first_screen_offers_examples_and_nothing_to_redo(qtbot, data_dir):
    from kwker.app.views.chat_view import EXAMPLES

    win = open_window(qtbot)
    shown = win.view.toPlainText()
    assert "Ask anything" in shown and all(e in shown for e in EXAMPLES)
    assert not win.chat.regen_button.isEnabled() and not win.chat.export_button.isEnabled()
    win.chat.link.emit("example", "0")  # a click on the first example sends it
    qtbot.waitUntil(lambda: not win.generating and len(win.messages) == 2, timeout=120_000)
    assert win.messages[0].content == EXAMPLES[0] and "Paris" in win.messages[1].content
    assert win.chat.regen_button.isEnabled() and win.chat.export_button.isEnabled()
