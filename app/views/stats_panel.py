"""Live statistics: tokens/s while streaming, prefill, the speedup over plain decoding (measured in the same
answer: see GenerationStats.speedup), accepted tokens by source, and a small chart of tokens/s over the
answer. A Kwker server reports the same figures; any other server's are measured here (the time to
the first token and the rate of the streamed tokens), said so, and have no speedup."""

from __future__ import annotations

from PySide6.QtCore import QPointF, Qt
from PySide6.QtGui import QColor, QPainter, QPen, QPolygonF
from PySide6.QtWidgets import QFormLayout, QLabel, QVBoxLayout, QWidget

# While an answer streams, its speedup is shown once it has this many tokens: before, the rate covers a few steps,
# and speculation's first steps (still measuring what widths pay) can read well below or above what it settles at.
SPEEDUP_MIN_TOKENS = 16
SPEEDUP_TIP = (
    "How much faster this answer's tokens came than plain decoding would have given them: the "
    "typical time of its steps against that of plain one-token steps: the latest 32, its own "
    "and the ones before it, leaving out each answer's first four steps, which run slower after "
    "the prompt (1.00× when speculation proposed nothing)."
)
SERVER_FIGURES = "reported by the server (Kwker)"
CLIENT_FIGURES = "measured by this app from the streamed tokens: this server reports no figures"
NO_SPEEDUP_TIP = "This server does not report how its tokens were decoded: no speedup to show."
ALL_SPECULATED_TIP = (
    "Every step of this answer verified tokens that speculation proposed (an answer that quotes "
    "its prompt, a document say), and no earlier answer of this model ran a plain one-token step: "
    "there is none to measure against. "
    "The exactness split view (Compare…) times plain decoding on the same prompt."
)


class RateChart(QWidget):
    """tokens/s samples over the answer, as a line."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.samples: list[float] = []
        self.color = QColor("#2f6fde")
        self.setMinimumHeight(70)
        self.setAccessibleName("tokens per second chart")

    def set_samples(self, samples: list[float]) -> None:
        self.samples = samples[-200:]
        self.update()

    def paintEvent(self, event):  # noqa: N802
        p = QPainter(self)
        p.setRenderHint(QPainter.Antialiasing)
        r = self.rect().adjusted(2, 2, -2, -2)
        p.setPen(QPen(self.palette().mid().color(), 1))
        p.drawRect(r)
        if len(self.samples) < 2:
            return
        top = max(self.samples) * 1.15 or 1.0
        n = len(self.samples) - 1
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
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(self.chart)
        layout.addStretch(1)
        self.samples: list[float] = []

    def set_model(self, info: dict) -> None:
        self.reference.setText("–")
        self.speedup.setText("–")
        self.speedup.setToolTip(SPEEDUP_TIP)
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
        self.samples = []
        self.chart.set_samples([])

    def update_stats(self, s: dict, final: bool = False) -> None:
        """s: a generation's statistics so far (final: the finished answer's)."""
        self._documents(s.get("documents", []))
        if s.get("measured") == "client":
            self._client_figures(s)
            return
        if s.get("measured") == "server":
            self.measured.setText(SERVER_FIGURES)
        rate = s.get("tokens_per_s", 0.0)
        if s.get("new_tokens", 0) > 1:
            self.samples.append(rate)
            self.chart.set_samples(self.samples)
        self.rate.setText(f"{rate:.1f} tokens/s")
        speedup, plain = s.get("speedup"), s.get("plain_steps", 0)
        reference = s.get("reference_steps", plain)  # plain steps the speedup is measured against
        if speedup is not None and (final or s.get("new_tokens", 0) >= SPEEDUP_MIN_TOKENS):
            self.speedup.setText(f"{speedup:.2f}×")
            self.speedup.setToolTip(SPEEDUP_TIP)
        elif final and s.get("steps") and not reference:
            # no plain step to measure against: an answer that copied its prompt (a quoted
            # document) from the first step to the last
            self.speedup.setText("every step speculated")
            self.speedup.setToolTip(ALL_SPECULATED_TIP)
        else:
            self.speedup.setText("measuring…" if not final else "–")
        if reference:
            # the warm plain steps, the decoder's latest and this answer's (GenerationStats.
            # reference_steps): the first steps after a prompt run slower
            own = s.get("reference_own", plain)
            steps = "step" if reference == 1 else "steps"
            where = (
                "in this answer"
                if reference == own
                else f"(the latest; {own or 'none'} in this answer)"
            )
            self.reference.setText(
                f"{s['plain_tokens_per_s']:.1f} tokens/s: the median of {reference} plain "
                f"one-token {steps} {where}"
            )
        elif final:  # not the previous answer's figure
            self.reference.setText("no plain step measured yet")
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
