"""The exactness split view: one prompt answered twice by the loaded model, by plain decoding
(one token a step: no prompt lookup, no draft) and by Kwker's speculation (prompt lookup, and the
draft model when one is loaded), side by side; then the two answers compared token id by token id.

They run one after the other on the worker's thread, plain first: both have the machine to
themselves (run at once they would share its cores and each would measure the other's load), and
the rates are the decode rates, prefill excluded, so the second run finding the prompt in the KV
cache does not flatter it. A sampled answer uses one seed for both runs: the engine draws position
i's random number once, so the two texts must be the same for a seed as for greedy decoding."""

from __future__ import annotations

import html
import secrets
from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QDialog,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QTextBrowser,
    QVBoxLayout,
)

PLAIN, SPECULATION = 0, 1
ORDER_NOTE = (
    "The two run one after the other, plain decoding first, on the same prompt and seed: each has "
    "the machine to itself. Rates are generation rates (the prompt's time left out)."
)


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first position where two token id lists differ (a shorter list differs where it ends),
    or None when they are the same."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


class SplitView(QDialog):
    request_compare = Signal(list, dict, int)  # messages, settings, the window's start

    def __init__(self, window):
        super().__init__(window)
        self.window_ = window
        self.setWindowTitle("Exactness: plain decoding and speculation")
        self.resize(1100, 640)
        self.tokens: list[list[int]] = [[], []]
        self.pieces: list[list[str]] = [[], []]
        self.stats: list[dict] = [{}, {}]
        self.running = self.stopping = False
        self.difference: int | None = None

        self.prompt = QPlainTextEdit(window.input.toPlainText().strip())
        self.prompt.setPlaceholderText("A prompt to answer both ways")
        self.prompt.setAccessibleName("prompt to compare")
        self.prompt.setMaximumHeight(90)
        self.run_button = QPushButton("Run both")
        self.run_button.setObjectName("send")
        self.run_button.setAccessibleName("run plain decoding and speculation")
        self.run_button.clicked.connect(self.run_or_stop)
        # as wide as its widest label: "Stop" while running would otherwise leave it too narrow
        # for "Run both" after (the label was clipped in a screenshot)
        widest = max(
            self.run_button.fontMetrics().horizontalAdvance(t) for t in ("Run both", "Stop")
        )
        self.run_button.setMinimumWidth(widest + 40)
        self.order = QLabel(ORDER_NOTE)
        self.order.setWordWrap(True)
        self.order.setObjectName("muted")
        self.verdict = QLabel("")
        self.verdict.setObjectName("big")
        self.verdict.setAccessibleName("comparison")
        self.verdict.setTextFormat(Qt.RichText)
        self.verdict.setWordWrap(True)  # a long verdict wraps instead of pushing the speedup out
        self.speedup = QLabel("")
        self.speedup.setAccessibleName("speedup of speculation")

        self.heads, self.columns, self.rates = [], [], []
        grid = QGridLayout()
        for col in (PLAIN, SPECULATION):
            head = QLabel()
            head.setWordWrap(True)
            view = QTextBrowser()
            view.setAccessibleName(("plain decoding", "speculation")[col] + " answer")
            rate = QLabel("–")
            rate.setAccessibleName(("plain decoding", "speculation")[col] + " rate")
            grid.addWidget(head, 0, col)
            grid.addWidget(view, 1, col)
            grid.addWidget(rate, 2, col)
            self.heads.append(head)
            self.columns.append(view)
            self.rates.append(rate)

        top = QHBoxLayout()
        top.addWidget(self.prompt, 1)
        top.addWidget(self.run_button)
        layout = QVBoxLayout(self)
        layout.addLayout(top)
        layout.addWidget(self.order)
        layout.addLayout(grid, 1)
        bottom = QHBoxLayout()
        bottom.addWidget(self.verdict, 1)
        bottom.addWidget(self.speedup)
        layout.addLayout(bottom)

        worker = window.worker
        self.request_compare.connect(worker.compare)
        worker.compare_chunk.connect(self._on_chunk)
        worker.compare_done.connect(self._on_done)
        worker.compare_failed.connect(self._on_failed)
        worker.compare_finished.connect(self._on_finished)
        self._describe()

    # -------------------------------------------------------------------------------------- running
    def _describe(self):
        info = self.window_.model_info or {}
        settings = self.window_.effective_settings()
        self.heads[PLAIN].setText("<b>Plain decoding</b><br>one token a step: no lookup, no draft")
        # a draft by its name: a local folder's last part, a repository as it is
        draft = f", draft {Path(info['draft']).name}" if info.get("draft") else ""
        self.heads[SPECULATION].setText(
            f"<b>Kwker's speculation</b><br>prompt lookup ({int(settings['lookup_tokens'])} "
            f"tokens){html.escape(draft)}"
        )

    def run_or_stop(self):
        if self.running:
            self.stopping = True
            self.window_.worker.request_stop()
        else:
            self.run()

    def run(self) -> bool:
        """Starts both runs; False when the window's model is busy, on a server or absent."""
        win = self.window_
        prompt = self.prompt.toPlainText().strip()
        info = win.model_info
        if not prompt or self.running or win.generating or info is None or info.get("server"):
            return False
        settings = dict(win.effective_settings())
        settings["lookup"] = True  # the speculation column's; the plain one turns it off
        if settings["temperature"] > 0 and int(settings["seed"]) < 0:
            settings["seed"] = secrets.randbits(31)  # one seed for both runs
        self.seed = int(settings["seed"]) if settings["temperature"] > 0 else None
        self.tokens, self.pieces, self.stats = [[], []], [[], []], [{}, {}]
        self.difference = None
        for col in (PLAIN, SPECULATION):
            self.columns[col].clear()
            self.rates[col].setText("waiting…" if col == SPECULATION else "running…")
        how = "greedy" if self.seed is None else f"sampled with seed {self.seed}"
        self.verdict.setText(f"Running plain decoding, then speculation ({how})…")
        self.speedup.setText("")
        self._describe()
        self.running, self.stopping = True, False
        win.comparing = True  # the window sends nothing until the worker's compare_finished
        self.run_button.setText("Stop")
        self.request_compare.emit([{"role": "user", "content": prompt}], settings, 0)
        return True

    def _on_chunk(self, column: int, text: str, token: int):
        self.tokens[column].append(token)
        self.pieces[column].append(text)
        self._draw(column)

    def _on_done(self, column: int, stats: dict):
        self.stats[column] = stats
        self.rates[column].setText(self._rate(stats))
        if column == PLAIN:
            self.rates[SPECULATION].setText("running…")
            return
        self._finish()
        if self.stopping:  # two answers cut at different places: nothing to compare
            self.verdict.setText("Stopped: nothing to compare")
            return
        self.difference = first_difference(*self.tokens)
        for col in (PLAIN, SPECULATION):
            self._draw(col)
        how = "greedy decoding" if self.seed is None else f"seed {self.seed}"
        n = len(self.tokens[PLAIN])
        if self.difference is None:
            self.verdict.setText(
                f'<span style="color:#1a7f37">✓ identical</span>: the same {n} tokens, id for '
                f"id ({how})"
            )
        else:
            self.verdict.setText(
                f'<span style="color:#cf222e">✗ differ from token {self.difference + 1}</span> '
                f"({how}): marked in both columns. Speculation must never change the text: "
                "please report this"
            )
        plain, spec = self.stats[PLAIN], self.stats[SPECULATION]
        if plain.get("tokens_per_s") and spec.get("tokens_per_s"):
            ratio = spec["tokens_per_s"] / plain["tokens_per_s"]
            self.speedup.setText(f"Speedup: <b>{ratio:.2f}×</b>")

    def _on_failed(self, message: str):
        self._finish()
        self.verdict.setText(f"Error: {html.escape(message)}")

    def _on_finished(self):
        if self.running:  # stopped before speculation's run ended
            self._finish()
            self.verdict.setText("Stopped: nothing to compare")

    def _finish(self):
        self.running = False
        self.run_button.setText("Run both")

    @staticmethod
    def _rate(stats: dict) -> str:
        rate = f"{stats.get('tokens_per_s', 0):.1f} tokens/s"
        accepted = stats.get("accepted", {})
        proposed = stats.get("proposed", {})
        kept = [f"{accepted.get(s, 0)} of {proposed[s]} from {s}" for s in proposed if proposed[s]]
        steps = f"{stats.get('new_tokens', 0)} tokens in {stats.get('steps', 0) + 1} steps"
        return " · ".join([rate, steps, *kept])

    def _draw(self, column: int):
        """The column's text; from the first difference on, on red in both columns."""
        pieces, cut = self.pieces[column], self.difference
        same = "".join(pieces if cut is None else pieces[:cut])
        rest = "" if cut is None else "".join(pieces[cut:])
        body = html.escape(same)
        if rest or cut is not None:
            body += f'<span style="background-color:#ffcecb">{html.escape(rest) or "∎"}</span>'
        self.columns[column].setHtml(f'<div style="white-space:pre-wrap">{body}</div>')

    @property
    def done(self) -> bool:
        return not self.running and bool(self.stats[SPECULATION])

    def closeEvent(self, event):  # noqa: N802
        if self.running:
            self.window_.worker.request_stop()
        worker = self.window_.worker
        for signal, slot in (
            (worker.compare_chunk, self._on_chunk),
            (worker.compare_done, self._on_done),
            (worker.compare_failed, self._on_failed),
            (worker.compare_finished, self._on_finished),
        ):
            signal.disconnect(slot)
        super().closeEvent(event)
