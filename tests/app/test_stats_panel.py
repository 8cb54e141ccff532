"""The statistics panel's figures (kwker.speedup, measured in the answer itself): the speedup, or
"–" with the reason on hover; plain decoding's rate as the answer's rate over its speedup, so the
rate, the reference and the chart agree; the figures of the conversation shown, cleared on a new
one."""

from kwker.app.views.stats_panel import StatsPanel

MODEL = {"model": "m", "precision": "int4", "isa": "avx2", "threads": 2}


def stats(new_tokens, speedup, rate=150.0, why="", reference=8, **more):
    return {
        "tokens_per_s": rate,
        "new_tokens": new_tokens,
        "speedup": speedup,
        "speedup_why": why,
        "reference_steps": reference,
        "tokens_per_step": 2.5,
        "proposed": {"lookup": 40},
        "accepted": {"lookup": 30},
        **more,
    }


def test_too_little_evidence_reads_a_dash_with_the_reason_on_hover(qtbot):
    panel = StatsPanel()
    qtbot.addWidget(panel)
    panel.set_model(MODEL)
    why = "Too little evidence: 2 plain one-token steps in this answer"
    panel.update_stats(stats(40, None, why=why), final=True)
    assert panel.speedup.text() == "–" and panel.speedup.toolTip() == why
    assert panel.reference.text() == "–"  # no reference shown where there is no figure
    assert panel.rate.text() == "150.0 tokens/s"


def test_the_rate_the_reference_and_the_speedup_agree(qtbot):
    panel = StatsPanel()
    qtbot.addWidget(panel)
    panel.set_model(MODEL)
    panel.update_stats(stats(60, 2.0, rate=120.0), final=True)
    assert panel.speedup.text() == "2.00×"
    assert panel.reference.text().startswith("≈ 60.0 tokens/s (timed by 8 plain one-token steps")
    assert panel.chart.plain == 60.0  # the chart's dashed line is the same figure


def test_plain_decoding_says_so(qtbot):
    panel = StatsPanel()
    qtbot.addWidget(panel)
    panel.update_stats(stats(60, 1.0, rate=90.0, proposed={}, accepted={}), final=True)
    assert panel.speedup.text() == "1.00×"
    assert panel.reference.text() == "90.0 tokens/s: this answer was plain decoding"


def test_the_chart_draws_the_plain_line_within_its_scale(qtbot):
    """The plain rate above every streamed sample still fits the chart (it once read "Plain
    decoding 267 tokens/s" beside a chart whose maximum was 72)."""
    panel = StatsPanel()
    qtbot.addWidget(panel)
    panel.resize(300, 300)
    images = []
    for plain in (100.0, 0.0):  # the same samples with and without the line: their difference
        panel.chart.set_samples([40.0, 50.0, 60.0], plain=plain)
        images.append(panel.chart.grab().toImage())
    with_line, without = images
    assert with_line.size() == without.size()
    width, height = with_line.width(), with_line.height()
    rows = [
        y
        for y in range(height)  # the samples' line moves too (the scale), but on few pixels a row
        if sum(with_line.pixel(x, y) != without.pixel(x, y) for x in range(width)) > width // 2
    ]
    assert rows, "no dashed line drawn"
    top = 100.0 * 1.15  # the scale's top: 15% over the highest of the samples and the line
    expected = (height - 2) - (height - 4) * 100.0 / top
    assert all(abs(y - expected) <= 2 for y in rows), (rows, expected)


def test_clear_and_show_answer_replace_every_figure(qtbot):
    panel = StatsPanel()
    qtbot.addWidget(panel)
    panel.update_stats(stats(60, 2.0), final=True)
    panel.clear()
    labels = (panel.rate, panel.speedup, panel.reference, panel.prefill, panel.per_step)
    assert all(label.text() == "–" for label in labels)
    panel.show_answer(stats(60, 1.5, rate=30.0))
    assert panel.speedup.text() == "1.50×" and panel.rate.text() == "30.0 tokens/s"
    panel.show_answer({})  # a conversation with no answer yet
    assert all(label.text() == "–" for label in labels)
