"""The statistics panel's speedup figure: measured rate over the plain rate measured at load, shown while an
answer streams once it has enough tokens to mean something, and always for a finished answer."""

from app.views.stats_panel import SPEEDUP_MIN_TOKENS, StatsPanel

MODEL = {
    "model": "m",
    "precision": "int4",
    "isa": "avx2",
    "threads": 2,
    "reference_tokens_per_s": 200.0,
}


def test_speedup_waits_for_enough_tokens_while_streaming(qtbot):
    panel = StatsPanel()
    qtbot.addWidget(panel)
    assert panel.speedup.text() == "–"
    panel.set_model(MODEL)
    panel.update_stats({"tokens_per_s": 150.0, "new_tokens": SPEEDUP_MIN_TOKENS - 1})
    assert panel.speedup.text() == "measuring…" and panel.rate.text() == "150.0 tokens/s"
    panel.update_stats({"tokens_per_s": 310.0, "new_tokens": SPEEDUP_MIN_TOKENS})
    assert panel.speedup.text() == "1.55×"


def test_a_short_finished_answer_shows_its_speedup(qtbot):
    panel = StatsPanel()
    qtbot.addWidget(panel)
    panel.set_model(MODEL)
    panel.update_stats({"tokens_per_s": 180.0, "new_tokens": 6}, final=True)
    assert panel.speedup.text() == "0.90×"
    panel.set_model(
        {**MODEL, "reference_tokens_per_s": 0.0}
    )  # no plain rate measured (a tiny context)
    panel.update_stats({"tokens_per_s": 180.0, "new_tokens": 40}, final=True)
    assert panel.speedup.text() == "–"
