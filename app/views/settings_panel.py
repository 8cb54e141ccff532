"""The settings panel: model and how it runs (app-wide), and how it answers (app defaults, or this
conversation's own values when 'This conversation only' is ticked). Emits the new values; the window
saves them. For a model on a server, what only a local decoder has (precision, draft, context,
threads, prompt lookup, top-k, min-p, repetition penalty) is hidden: the server applies its own."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QButtonGroup,
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QGroupBox,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QRadioButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from kwker.app.context_window import ROLLING, STOP
from kwker.app.settings import DEFAULTS, PER_CONVERSATION
from kwker.precision import AUTO
from kwker.precision import label as precision_label

# The precisions the panel offers, fastest first: each one click away
PRECISIONS = [
    ("int4: the fastest, nearly the same answers", "int4"),
    (f"{precision_label('balanced')}: closer, slower", "balanced"),
    (f"{precision_label('bf16')}: closer still, slower", "bf16"),
    ("Exact: the model's own weights", AUTO),
]
PRECISION_NOTE = (
    "A step reads every weight once, so fewer bits per weight mean more tokens per second; int4 "
    "keeps nearly every answer of the model's own weights."
)
THEMES = [("Follow the system", "system"), ("Light", "light"), ("Dark", "dark")]
OVERFLOW = [
    ("Drop the oldest messages (rolling window)", ROLLING),
    ("Stop and say so", STOP),
]


def _spin(lo, hi, step=1.0, decimals=2, name=""):
    w = QDoubleSpinBox() if isinstance(step, float) else QSpinBox()
    w.setRange(lo, hi)
    w.setSingleStep(step)
    if isinstance(w, QDoubleSpinBox):
        w.setDecimals(decimals)
    w.setAccessibleName(name)
    return w


class SettingsPanel(QWidget):
    changed = Signal(dict, bool)  # values, whether they apply to the current conversation only

    def __init__(self, parent=None):
        super().__init__(parent)
        self.model = QLineEdit()
        self.model.setAccessibleName("model")
        self.model.setToolTip("A hub id, a local folder or a .gguf file")
        self.server = QLabel("")
        self.server.setWordWrap(True)
        self.server.setAccessibleName("server")
        self.server.setToolTip("Models… → Servers chooses another, or a model on this computer")
        self.precision = QButtonGroup(self)
        precision_box = QWidget()
        precision_box.setAccessibleName("precision")
        pl = QVBoxLayout(precision_box)
        pl.setContentsMargins(0, 0, 0, 0)
        for i, (text, name) in enumerate(PRECISIONS):
            button = QRadioButton(text)
            button.setProperty("precision", name)
            self.precision.addButton(button, i)
            pl.addWidget(button)
        note = QLabel(PRECISION_NOTE)
        note.setWordWrap(True)
        note.setObjectName("muted")
        pl.addWidget(note)
        self.draft_model = QComboBox()
        self.draft_model.setEditable(True)
        self.draft_model.setAccessibleName("draft model")
        self.draft_model.setToolTip(
            "Only models with the same tokenizer as the chat model are offered"
        )
        self.context_length = _spin(256, 32768, 256, name="context length")
        self.context_overflow = QComboBox()
        for text, value in OVERFLOW:
            self.context_overflow.addItem(text, value)
        self.context_overflow.setAccessibleName("when a chat outgrows the context")
        self.threads = _spin(0, 256, 1, name="threads")
        self.threads.setSpecialValueText("all cores")
        self.theme = QComboBox()
        for label, value in THEMES:
            self.theme.addItem(label, value)
        self.theme.setAccessibleName("theme")
        self.tint = QCheckBox("Tint tokens that came from speculation")

        self.lookup = QCheckBox("Prompt lookup")
        self.lookup_tokens = _spin(1, 32, 1, name="lookup length")
        self.temperature = _spin(0.0, 2.0, 0.05, name="temperature")
        self.temperature.setToolTip("0 answers greedily")
        self.top_p = _spin(0.0, 1.0, 0.05, name="top-p")
        self.top_k = _spin(0, 1000, 1, name="top-k")
        self.top_k.setSpecialValueText("off")
        self.min_p = _spin(0.0, 1.0, 0.01, name="min-p")
        self.repetition_penalty = _spin(0.5, 2.0, 0.05, name="repetition penalty")
        self.seed = _spin(-1, 2**31 - 1, 1, name="seed")
        self.seed.setSpecialValueText("random")
        self.max_new_tokens = _spin(1, 32768, 64, name="max new tokens")
        # where the sampling values came from: the model's preset, Kwker's default, the user's
        self.sources = QLabel("")
        self.sources.setObjectName("muted")
        self.sources.setWordWrap(True)
        self.sources.setAccessibleName("where the sampling settings come from")
        self.system_prompt = QPlainTextEdit()
        self.system_prompt.setAccessibleName("system prompt")
        self.system_prompt.setMaximumHeight(80)
        self.conversation_only = QCheckBox("This conversation only")
        self.apply_button = QPushButton("Apply")
        self.apply_button.setAccessibleName("apply settings")
        self.reset_button = QPushButton("Use app defaults")

        run = QGroupBox("Model")
        f = QFormLayout(run)
        f.addRow("Server", self.server)
        f.addRow("Model", self.model)
        f.addRow("Precision", precision_box)
        f.addRow("Draft model", self.draft_model)
        f.addRow("Context length", self.context_length)
        f.addRow("Longer chats", self.context_overflow)
        f.addRow("Threads", self.threads)
        f.addRow("Theme", self.theme)
        f.addRow(self.tint)
        answer = QGroupBox("Answers")
        g = QFormLayout(answer)
        g.addRow(self.lookup, self.lookup_tokens)
        g.addRow("Temperature", self.temperature)
        g.addRow("Top-p", self.top_p)
        g.addRow("Top-k", self.top_k)
        g.addRow("Min-p", self.min_p)
        g.addRow("Repetition penalty", self.repetition_penalty)
        g.addRow(self.sources)
        g.addRow("Seed", self.seed)
        g.addRow("Max new tokens", self.max_new_tokens)
        g.addRow("System prompt", self.system_prompt)
        g.addRow(self.conversation_only)
        self.forms = (f, g)
        for form in self.forms:  # a field that does not fit beside its label goes under it
            form.setRowWrapPolicy(QFormLayout.WrapLongRows)
        # the rows a server's model hides: it applies its own precision, context and speculation,
        # and the OpenAI API has no top-k, min-p or repetition penalty
        self._local_rows = (
            self.model, precision_box, self.draft_model, self.context_length,
            self.context_overflow, self.threads, self.tint, self.lookup_tokens, self.top_k,
            self.min_p, self.repetition_penalty,
        )  # fmt: skip
        layout = QVBoxLayout(self)
        layout.addWidget(run)
        layout.addWidget(answer)
        layout.addWidget(self.apply_button)
        layout.addWidget(self.reset_button)
        layout.addStretch(1)
        self.apply_button.clicked.connect(
            lambda: self.changed.emit(self.values(), self.conversation_only.isChecked())
        )
        self.reset_button.clicked.connect(self._use_defaults)
        self._app_values = dict(DEFAULTS)
        self.show_remote("", "")

    def _use_defaults(self):
        self.conversation_only.setChecked(False)
        self.show_values(self._app_values, {})
        self.changed.emit({}, True)  # clears the conversation's overrides

    def show_sources(self, sources: dict) -> None:
        """sources: sampling setting -> where its value came from (kwker.app.settings)."""
        names = {"temperature": "temperature", "top_p": "top-p", "top_k": "top-k",
                 "min_p": "min-p", "repetition_penalty": "repetition penalty"}  # fmt: skip
        by_source: dict[str, list[str]] = {}
        for key, source in sources.items():
            by_source.setdefault(source, []).append(names[key])
        self.sources.setText(
            "; ".join(f"{', '.join(keys)}: {source}" for source, keys in by_source.items())
        )

    def set_draft_choices(self, names: list[str]) -> None:
        current = self.draft_model.currentText()
        self.draft_model.clear()
        self.draft_model.addItem("")
        self.draft_model.addItems(names)
        self.draft_model.setCurrentText(current)

    def show_remote(self, server: str, model: str) -> None:
        """Shows the rows a model on `server` uses ("": a local model, all of them)."""
        self.server.setText(f"{model} on {server}" if server else "")
        for field in (self.server, *self._local_rows):
            local_row = field is not self.server
            for form in self.forms:
                if form.indexOf(field) >= 0:
                    form.setRowVisible(field, local_row != bool(server))

    def show_values(self, app_values: dict, overrides: dict) -> None:
        self._app_values = dict(app_values)
        v = {**app_values, **overrides}
        self.show_remote(v["server_url"], v["server_model"])
        self.model.setText(v["model"])
        for button in self.precision.buttons():
            button.setChecked(button.property("precision") == v["precision"])
        self.draft_model.setCurrentText(v["draft_model"])
        self.context_length.setValue(int(v["context_length"]))
        self.context_overflow.setCurrentIndex(
            max(0, self.context_overflow.findData(v["context_overflow"]))
        )
        self.threads.setValue(int(v["threads"]))
        self.theme.setCurrentIndex(max(0, self.theme.findData(v["theme"])))
        self.tint.setChecked(bool(v["tint_speculation"]))
        self.lookup.setChecked(bool(v["lookup"]))
        self.lookup_tokens.setValue(int(v["lookup_tokens"]))
        self.temperature.setValue(float(v["temperature"]))
        self.top_p.setValue(float(v["top_p"]))
        self.top_k.setValue(int(v["top_k"]))
        self.min_p.setValue(float(v["min_p"]))
        self.repetition_penalty.setValue(float(v["repetition_penalty"]))
        self.seed.setValue(int(v["seed"]))
        self.max_new_tokens.setValue(int(v["max_new_tokens"]))
        self.system_prompt.setPlainText(v["system_prompt"])
        self.conversation_only.setChecked(bool(overrides))

    def precision_value(self) -> str:
        button = self.precision.checkedButton()
        return button.property("precision") if button is not None else DEFAULTS["precision"]

    def values(self) -> dict:
        return {
            "model": self.model.text().strip() or DEFAULTS["model"],
            "precision": self.precision_value(),
            "draft_model": self.draft_model.currentText().strip(),
            "context_length": self.context_length.value(),
            "context_overflow": self.context_overflow.currentData(),
            "threads": self.threads.value(),
            "theme": self.theme.currentData(),
            "tint_speculation": self.tint.isChecked(),
            "lookup": self.lookup.isChecked(),
            "lookup_tokens": self.lookup_tokens.value(),
            "temperature": self.temperature.value(),
            "top_p": self.top_p.value(),
            "top_k": self.top_k.value(),
            "min_p": self.min_p.value(),
            "repetition_penalty": self.repetition_penalty.value(),
            "seed": self.seed.value(),
            "max_new_tokens": self.max_new_tokens.value(),
            "system_prompt": self.system_prompt.toPlainText(),
        }


def split_values(values: dict, conversation_only: bool) -> tuple[dict, dict]:
    """(app-wide values, conversation overrides) for values saved from the panel."""
    if not conversation_only:
        return values, {}
    return (
        {k: v for k, v in values.items() if k not in PER_CONVERSATION},
        {k: v for k, v in values.items() if k in PER_CONVERSATION},
    )
