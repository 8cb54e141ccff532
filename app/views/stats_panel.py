"""Live statistics: tokens/s while streaming, prefill, the speedup over plain decoding (measured in
the same answer: see GenerationStats.speedup), accepted tokens by source, and a small chart of
tokens/s over the answer. A Kwker server reports the same figures; any other server's are measured
here (the time to the first token and the rate of the streamed tokens), said so, and have no
speedup."""

from __future__ import annotations

from PySide6.QtCore import QPointF, Qt
from PySide6.QtGui import QColor, QPainter, QPen, QPolygonF
from PySide6.QtWidgets import QFormLayout, QLabel, QVBoxLayout, QWidget

SPEEDUP_TIP = (
    "How much faster this answer's tokens came than plain decoding would have given them, "
    "measured in the answer itself: its tokens times its own plain one-token step, against the "
    "time its steps took (an answer's first four steps, which run slower after the prompt, left "
    "out). It never exceeds the tokens a step gave. Compare… runs the A/B it estimates."
)
SERVER_FIGURES = "reported by the server (Kwker)"
CLIENT_FIGURES = "measured by this app from the streamed tokens: this server reports no figures"
NO_SPEEDUP_TIP = "This server does not report how its tokens were decoded: no speedup to show."


class RateChart(QWidget):
    """tokens/s samples over the answer, as a line."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.samples: list[float] = []
        self.plain = 0.0  # plain decoding's rate, drawn as a dashed line (0: none)
        self.color = QColor("#2f6fde")
        self.setMinimumHeight(70)
        self.setAccessibleName("tokens per second chart")

    def set_samples(self, samples: list[float], plain: float = 0.0) -> None:
        self.samples, self.plain = samples[-200:], plain
        self.update()

    def paintEvent(self, event):  # noqa: N802
        p = QPainter(self)
        p.setRenderHint(QPainter.Antialiasing)
        r = self.rect().adjusted(2, 2, -2, -2)
        p.setPen(QPen(self.palette().mid().color(), 1))
        p.drawRect(r)
        if len(self.samples) < 2:
            return
        top = max(*self.samples, self.plain) * 1.15 or 1.0
        n = len(self.samples) - 1
        if self.plain:
            y = r.bottom() - r.height() * self.plain / top
            p.setPen(QPen(self.palette().mid().color(), 1, Qt.DashLine))
            p.drawLine(QPointF(r.left(), y), QPointF(r.right(), y))
        poly = QPolygonF(
            [
                QPointF(r.left() + r.width() * i / n, r.bottom() - r.height() * v / top)
                for i, v in enumerate(self.samples)
            ]
        )
        p.setPen(QPen(self.color, 2))
        p.drawPolyline(poly)
        p.setPen(self.palette().text().color())
        p.drawText(
            r.adjusted(4, 2, 0, 0), Qt.AlignLeft | Qt.AlignTop, f"{max(self.samples):.0f} tok/s max"
        )
        if self.plain:
            p.drawText(
                r.adjusted(0, 2, -4, 0), Qt.AlignRight | Qt.AlignTop, f"- - plain {self.plain:.0f}"
            )


class StatsPanel(QWidget):
    def __init__(self, parent=None):
        super().__init__(parent)
        self.rate = QLabel("–")
        self.rate.setObjectName("big")
        self.rate.setAccessibleName("tokens per second")
        self.speedup = QLabel("–")
        self.speedup.setObjectName("big")
        self.speedup.setAccessibleName("speedup over plain decoding")
        self.speedup.setToolTip(SPEEDUP_TIP)
        self.prefill = QLabel("–")
        self.per_step = QLabel("–")
        self.lookup = QLabel("–")
        self.draft = QLabel("–")
        self.reference = QLabel("–")
        self.reference.setWordWrap(True)
        self.reference.setAccessibleName("plain decoding reference")
        self.model = QLabel("–")
        self.model.setWordWrap(True)
        self.measured = QLabel("–")
        self.measured.setWordWrap(True)
        self.measured.setAccessibleName("who measured these figures")
        self.documents = QLabel("–")
        self.documents.setWordWrap(True)
        self.documents.setAccessibleName("documents in the prompt")
        self.chart = RateChart()
        form = QFormLayout()
        form.addRow("Generation", self.rate)
        form.addRow("Speedup", self.speedup)
        form.addRow("Plain decoding", self.reference)
        form.addRow("Prompt", self.prefill)
        form.addRow("Tokens per step", self.per_step)
        form.addRow("Lookup accepted", self.lookup)
        form.addRow("Draft accepted", self.draft)
        form.addRow("Model", self.model)
        form.addRow("Figures", self.measured)
        form.setRowVisible(self.measured, False)  # shown for a server's model
        form.addRow("Documents", self.documents)
        form.setRowVisible(self.documents, False)  # shown for an answer from documents
        self.form = form
        form.setRowWrapPolicy(QFormLayout.WrapLongRows)
        for label in (self.prefill, self.per_step, self.lookup, self.draft, self.rate):
            label.setWordWrap(True)  # the panel's width is fixed: long figures wrap
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(self.chart)
        layout.addStretch(1)
        self.samples: list[float] = []  # the streamed answer's tokens/s, for the chart

    def set_model(self, info: dict) -> None:
        server = info.get("server")
        if server:
            self.model.setText(f"{info['model']} · on {server}")
            self.measured.setText("–")
        else:
            draft = f", draft {info['draft']}" if info.get("draft") else ""
            self.model.setText(
                f"{info['model']} · {info['precision']} · {info['isa']} · {info['threads']} "
                f"threads{draft}"
            )
        self.form.setRowVisible(self.measured, bool(server))

    def start(self) -> None:
        self.clear()

    def clear(self) -> None:
        """No answer's figures (a new conversation, an error, before the first answer)."""
        self.samples = []
        self.chart.set_samples([])
        for label in (self.rate, self.speedup, self.reference, self.prefill, self.per_step,
                      self.lookup, self.draft):  # fmt: skip
            label.setText("–")
        self.speedup.setToolTip(SPEEDUP_TIP)
        self._documents([])

    def show_answer(self, s: dict) -> None:
        """A finished answer's saved figures (the conversation's latest), without its chart."""
        self.clear()
        if s.get("new_tokens"):
            self.update_stats(s, final=True)

    def update_stats(self, s: dict, final: bool = False) -> None:
        """s: a generation's statistics so far (final: the finished answer's). The panel's figures
        agree with each other by construction: plain decoding's rate is the answer's rate over
        its speedup, and the chart draws both."""
        self._documents(s.get("documents", []))
        if s.get("measured") == "client":
            self._client_figures(s)
            return
        if s.get("measured") == "server":
            self.measured.setText(SERVER_FIGURES)
        rate = s.get("tokens_per_s", 0.0)
        speedup = s.get("speedup")
        plain = rate / speedup if speedup else 0.0
        if s.get("new_tokens", 0) > 1 and not final:
            self.samples.append(rate)
        self.chart.set_samples(self.samples, plain)
        self.rate.setText(f"{rate:.1f} tokens/s")
        if speedup is not None:
            self.speedup.setText(f"{speedup:.2f}×")
            self.speedup.setToolTip(SPEEDUP_TIP)
            steps, own = s.get("reference_steps", 0), s.get("reference_own_steps", 0)
            self.reference.setText(
                f"≈ {plain:.1f} tokens/s (timed by {steps} plain one-token steps, {own} of "
                "this answer)"
                if speedup != 1.0 or s.get("proposed")
                else f"{rate:.1f} tokens/s: this answer was plain decoding"
            )
        else:
            self.speedup.setText("–")
            self.speedup.setToolTip(s.get("speedup_why") or SPEEDUP_TIP)
            self.reference.setText("–")
        fresh = s.get("prompt_tokens", 0) - s.get("reused_prompt_tokens", 0)
        self.prefill.setText(
            f"{fresh} new tokens in {s.get('prefill_s', 0) * 1000:.0f} ms "
            f"({s.get('reused_prompt_tokens', 0)} reused from the cache)"
        )
        self.per_step.setText(f"{s.get('tokens_per_step', 0):.2f}")
        for label, src in ((self.lookup, "lookup"), (self.draft, "draft")):
            prop, acc = s.get("proposed", {}).get(src, 0), s.get("accepted", {}).get(src, 0)
            label.setText(f"{acc} of {prop} ({acc / prop:.0%})" if prop else "–")

    def _documents(self, cited: list[dict]) -> None:
        """What of the attached documents the answer's prompt held (its speedup above is then
        the one of answering from them: prompt lookup copies what the answer quotes)."""
        self.form.setRowVisible(self.documents, bool(cited))
        names: dict[str, list] = {}
        for c in cited:
            names.setdefault(c["name"], []).append(c)
        lines = []
        for name, parts in names.items():
            tokens = sum(c["tokens"] for c in parts)
            if parts[0]["part"] == 0:
                lines.append(f"{name}: whole, {tokens:,} tokens")
            else:
                which = ", ".join(str(c["part"]) for c in parts)
                lines.append(f"{name}: parts {which} of {parts[0]['parts']}, {tokens:,} tokens")
        self.documents.setText("\n".join(lines) or "–")

    def _client_figures(self, s: dict) -> None:
        """A server that reports nothing: what this app saw of its stream, and no speedup."""
        rate = s.get("tokens_per_s", 0.0)
        if s.get("new_tokens", 0) > 1:
            self.samples.append(rate)
            self.chart.set_samples(self.samples)
        self.rate.setText(f"{rate:.1f} tokens/s")
        self.speedup.setText("–")
        self.speedup.setToolTip(NO_SPEEDUP_TIP)
        self.reference.setText("–")
        self.prefill.setText(
            f"first token after {s.get('ttft_s', 0) * 1000:.0f} ms (the network, the server's "
            "queue and its prompt time)"
        )
        self.per_step.setText("–")
        self.lookup.setText("–")
        self.draft.setText("–")
        counted = "the server's token count" if s.get("counted") == "usage" else "streamed pieces"
        self.measured.setText(f"{CLIENT_FIGURES} ({s.get('new_tokens', 0)} tokens: {counted})")
