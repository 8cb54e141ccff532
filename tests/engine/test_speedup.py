"""The speedup figure (kwker.speedup.SpeedupMeter) on made-up step times: what an A/B would
measure, from the answer's own warm steps only, None with too little evidence, never above the
tokens a step gave."""

import statistics

from kwker.speedup import SpeedupMeter

COLD = SpeedupMeter.COLD_STEPS


def warmed(cold_s: float = 0.030) -> SpeedupMeter:
    """A meter past its cold steps (slow ones, which must not count)."""
    m = SpeedupMeter()
    for _ in range(COLD):
        m.add(None, 1, 1, cold_s)
    return m


def test_plain_decoding_reads_one():
    m = warmed()
    for i in range(20):
        m.add(None, 1, 1, 0.010 + 0.001 * (i % 3))
    assert m.speedup == 1.0 and m.why == ""


def test_the_figure_is_what_an_ab_of_the_same_steps_gives():
    """Plain steps of 10 ms; lookup steps of 5 fed tokens giving 4 each at 20 ms: plain decoding
    would take 10 ms a token, speculation took 20 ms for 4 of them."""
    m = warmed()
    for _ in range(8):
        m.add(None, 1, 1, 0.010)
    for _ in range(30):
        m.add("lookup", 5, 4, 0.020)
    tokens = 8 + 30 * 4
    assert m.speedup == tokens * 0.010 / (8 * 0.010 + 30 * 0.020)
    # an A/B: plain decoding of the same tokens against the steps as they ran
    assert abs(m.speedup - (tokens * 0.010) / (8 * 0.010 + 30 * 0.020)) < 1e-12


def test_cold_steps_count_on_neither_side():
    slow = warmed(cold_s=1.0)
    fast = warmed(cold_s=0.010)
    for m in (slow, fast):
        for _ in range(8):
            m.add(None, 1, 1, 0.010)
        for _ in range(10):
            m.add("lookup", 4, 3, 0.015)
    assert slow.speedup == fast.speedup


def test_too_few_plain_steps_give_no_figure_and_say_why():
    m = warmed()
    for _ in range(SpeedupMeter.MIN_PLAIN - 1):
        m.add(None, 1, 1, 0.010)
    for _ in range(10):
        m.add("lookup", 5, 5, 0.020)
    assert m.speedup is None and "plain one-token steps" in m.why
    m.add(None, 1, 1, 0.010)
    assert m.speedup is not None and m.why == ""


def test_a_short_answer_gives_no_figure():
    m = warmed()
    for _ in range(SpeedupMeter.MIN_TOKENS - 1):
        m.add(None, 1, 1, 0.010)
    assert m.speedup is None and m.why.startswith("Too short")


def test_the_figure_never_exceeds_the_tokens_a_step_gave():
    """Plain steps timed slow (a busy moment) against fast speculative ones: 3 tokens a step can
    never be more than 3x, however the timings fell."""
    m = warmed()
    for _ in range(8):
        m.add(None, 1, 1, 0.050)
    for _ in range(8):
        m.add("lookup", 4, 3, 0.010)
    per_step = m.tokens / m.warm_steps
    assert m.speedup == per_step < 0.050 * m.tokens / (8 * 0.050 + 8 * 0.010)


def test_one_slow_step_does_not_sway_it():
    a, b = warmed(), warmed()
    for m in (a, b):
        for _ in range(9):
            m.add(None, 1, 1, 0.010)
        for _ in range(9):
            m.add("lookup", 5, 4, 0.020)
    a.add(None, 1, 1, 0.010)
    b.add(None, 1, 1, 0.500)  # the machine held one step up
    assert abs(a.speedup - b.speedup) / a.speedup < 0.02
    assert b.plain_step_s == statistics.median([0.010] * 9 + [0.500])


def test_it_asks_for_a_plain_step_after_a_run_of_speculative_ones():
    m = warmed()
    for _ in range(SpeedupMeter.REFERENCE_GAP - 1):
        m.add("lookup", 5, 5, 0.020)
    assert not m.wants_plain()
    m.add("lookup", 5, 5, 0.020)
    assert m.wants_plain()
    m.add(None, 1, 1, 0.010)
    assert not m.wants_plain()


def test_earlier_plain_steps_join_only_when_this_answers_agree():
    """A rewrite takes few plain steps of its own: the decoder's recent ones make up the reference
    while this answer's (at least MIN_OWN) agree with them, and never where they disagree (an
    earlier answer under another load once gave 2.71x beside 1.07 tokens a step)."""
    for earlier, own, joins in (([0.010] * 8, 0.0105, True), ([0.005] * 8, 0.010, False)):
        m = SpeedupMeter(earlier=list(earlier))
        for _ in range(COLD):
            m.add(None, 1, 1, 0.030)
        for _ in range(SpeedupMeter.MIN_OWN):
            m.add(None, 1, 1, own)
        for _ in range(12):
            m.add("lookup", 9, 8, 0.025)
        assert (m.speedup is not None) == joins, m.why
        if joins:
            assert m.reference == earlier + [own] * SpeedupMeter.MIN_OWN
            assert m.speedup == min(m.tokens * m.plain_step_s / (2 * own + 12 * 0.025), 98 / 14)
