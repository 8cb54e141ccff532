"""The statistics panel's speedup figure (GenerationStats.speedup, measured in the answer itself): shown while
an answer streams once it has enough tokens to mean something, always for a finished answer, and the
plain-decoding line says what it measured."""

from app.views.stats_panel import SPEEDUP_MIN_TOKENS, StatsPanel

MODEL = {"model": "m", "precision": "int4", "isa": "avx2", "threads": 2}


def stats(new_tokens, speedup, plain_steps=5, plain_rate=200.0):
    return {
        "tokens_per_s": 150.0,
        "new_tokens": new_tokens,
        "speedup": speedup,
        "plain_steps": plain_steps,
        "plain_tokens_per_s": plain_rate,
    }


def test_speedup_waits_for_enough_tokens_while_streaming(qtbot):
    panel = StatsPanel()
    qtbot.addWidget(panel)
    assert panel.speedup.text() == "–"
    panel.set_model(MODEL)
    panel.update_stats(stats(SPEEDUP_MIN_TOKENS - 1, 1.4))
    assert panel.speedup.text() == "measuring…" and panel.rate.text() == "150.0 tokens/s"
    panel.update_stats(stats(SPEEDUP_MIN_TOKENS, 1.55))
    assert panel.speedup.text() == "1.55×"
    assert panel.reference.text() == (
        "200.0 tokens/s: the median of 5 plain one-token steps in this answer"
    )
    assert "plain" in panel.speedup.toolTip()


def test_a_short_finished_answer_shows_its_speedup(qtbot):
    panel = StatsPanel()
    qtbot.addWidget(panel)
    panel.set_model(MODEL)
    panel.update_stats(stats(6, 0.98), final=True)
    assert panel.speedup.text() == "0.98×"
    panel.update_stats(stats(1, None, plain_steps=0), final=True)  # one token: no step to measure
    assert panel.speedup.text() == "–"


def test_the_plain_line_says_when_earlier_answers_steps_are_in_the_reference(qtbot):
    panel = StatsPanel()
    qtbot.addWidget(panel)
    panel.set_model(MODEL)
    panel.update_stats({**stats(40, 3.2, plain_steps=1), "reference_steps": 32}, final=True)
    assert panel.reference.text() == (
        "200.0 tokens/s: the median of 32 plain one-token steps (the latest; 1 in this answer)"
    )
    # an answer's cold first step is not in the reference: only its warm ones count as its own
    panel.update_stats(
        {**stats(40, 3.2, plain_steps=2), "reference_steps": 32, "reference_own": 1}, final=True
    )
    assert panel.reference.text().endswith("(the latest; 1 in this answer)")
    panel.update_stats(
        {**stats(40, 3.2, plain_steps=3), "reference_steps": 2, "reference_own": 2}, final=True
    )
    assert panel.reference.text().endswith("the median of 2 plain one-token steps in this answer")


def test_an_answer_without_plain_steps_shows_a_speedup_against_earlier_ones(qtbot):
    panel = StatsPanel()
    qtbot.addWidget(panel)
    panel.set_model(MODEL)
    panel.update_stats(
        {**stats(40, 4.1, plain_steps=0), "reference_steps": 32, "steps": 6}, final=True
    )
    assert panel.speedup.text() == "4.10×"
    assert panel.reference.text() == (
        "200.0 tokens/s: the median of 32 plain one-token steps (the latest; none in this answer)"
    )
    panel.update_stats(
        {**stats(40, None, plain_steps=0), "reference_steps": 0, "steps": 6}, final=True
    )
    assert panel.speedup.text() == "every step speculated"
    assert panel.reference.text() == "no plain step measured yet"
