"""The cost model: step and draft costs relative to the 1-token step of their moment, shared by a
decoder's sequences, robust to a slow step or a slow stretch of the host, and a draft's cost read as
a fixed part and a part per token."""

import pytest
import torch
from spec_fakes import REPEATS, Clock, FakeDraft, SimulatedDraft, run, simulate, tiny_target

from kwker.hf import KwkDecoder
from kwker.speculative import LookupProposer, Speculator, StepCosts


@pytest.fixture(scope="module")
def target():
    return tiny_target()


def test_step_times_measured_by_earlier_sequences_let_a_new_one_propose_at_once():
    text = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12] * 3 + [1, 2, 3]
    fresh = Speculator(LookupProposer(), None, lookup_max=8)
    assert fresh.propose(text, room=50) == (
        None,
        [],
    )  # no 1-token step measured yet: a plain step first
    # a decoder whose steps cost the same from 1 to 9 tokens (the costs its earlier sequences
    # measured)
    measured = {fed: 1.0 for fed in range(2, 10)}
    spec = Speculator(
        LookupProposer(), None, lookup_max=8, costs=StepCosts(step1_s=0.004, relative=measured)
    )
    source, cands = spec.propose(text, room=50)
    assert (
        source == "lookup" and len(cands) > 2 and cands == [4, 5, 6, 7, 8, 9, 10, 11][: len(cands)]
    )
    # a sequence on its own measures the 1-token step first, and then tries one token more at a time
    # (twice as many after a long match, as here: 27 tokens)
    for _ in range(Speculator.PLAIN_WARMUP):
        fresh.feedback(None, 0, 0, 1, 0.004, None)
    assert fresh.propose(text, room=50) == ("lookup", [4, 5])
    assert fresh.propose([5, 1, 2, 9, 7, 1, 2], room=50) == ("lookup", [9])  # a short match: one
    spec.feedback(source, len(cands), len(cands), len(cands) + 1, 0.005, None)
    assert measured[len(cands) + 1] > 1.0  # what this sequence measures serves the next ones


def test_step_costs_are_relative_to_the_one_token_step_of_their_moment():
    """A machine that slows down after a size was measured does not make that size look cheap
    (relative costs), and one noisy measurement of a narrow step does not rule it out while a wider
    one was seen to be cheaper."""
    costs = StepCosts()
    spec = Speculator(LookupProposer(), None, costs=costs)
    spec.feedback(None, 0, 0, 1, 0.004, None)
    for _ in range(StepCosts.TRUSTED):  # 4-token steps at 1.25 one-token steps
        spec.feedback("lookup", 3, 3, 4, 0.005, None)
    for _ in range(20):  # the machine slows down by half
        spec.feedback(None, 0, 0, 1, 0.008, None)
    assert costs.relative[4] == pytest.approx(1.25) and costs.step_cost(4) == pytest.approx(1.25)
    for _ in range(StepCosts.TRUSTED):  # 2-token steps hit by noise: 3 one-token steps
        spec.feedback("lookup", 1, 1, 2, 0.024, None)
    assert costs.relative[2] > 2.9  # its own timings say so
    assert costs.step_cost(2) == pytest.approx(
        1.25
    )  # a wider step was seen at 1.25: this one is not dearer
    # wider than anything measured: the widest measured, and beyond it its cost per extra token
    assert costs.step_cost(5) == pytest.approx(1.25 + 0.25 / 3)


def test_one_slow_step_does_not_rule_its_width_out():
    """The host slows a step now and then (1-token steps in the app have read 2.4x their
    neighbours). A width first timed in such a step must not keep lookup from proposing for good:
    here the answer's first proposal is refused and its 2-token step takes 2.2 plain steps, then the
    answer copies the prompt (each step fed f tokens takes 1 + 0.1 (f - 1) plain steps)."""
    passage = list(range(100, 140))
    prompt = passage + [7]
    answer = [passage[0], 9] + passage[:36]  # "p0" then a word lookup cannot know, then the copy
    spec = Speculator(LookupProposer(), None, costs=StepCosts(step1_s=0.01))
    n = supplied = wide_steps = 0
    while n < len(answer):
        source, cands = spec.propose(prompt + answer[:n], room=len(answer) - n)
        accepted = 0
        while accepted < len(cands) and cands[accepted] == answer[n + accepted]:
            accepted += 1
        fed = len(cands) + 1
        relative = 2.2 if fed > 1 and wide_steps == 0 else 1 + 0.1 * (fed - 1)
        wide_steps += fed > 1
        spec.feedback(source, len(cands), accepted, fed, 0.01 * relative, None)
        n, supplied = n + accepted + 1, supplied + accepted
    assert wide_steps and supplied >= 25, supplied


def test_a_width_timed_in_a_slow_stretch_is_timed_again_later():
    """Steps of 5 tokens or more run at twice their cost for the first 60 steps (a slow stretch of
    the host), then at 1 + 0.06 a token: the widths priced in that stretch must be tried again
    (StepCosts.STALE), not avoided for good. A draft token costs 0.15 steps, 93% are kept."""
    step1_s = 0.01
    clock = Clock()
    draft = SimulatedDraft(clock, lambda k: 0.05 + 0.15 * k, step1_s, agree=0.93)
    spec = Speculator(None, draft, clock=clock)
    calls = [0]  # simulate times each step twice

    def step(fed):
        calls[0] += 1
        slow = 2.0 if fed >= 5 and calls[0] <= 120 else 1.0
        return slow * (1 + 0.06 * (fed - 1))

    tokens, seconds = simulate(spec, draft, step, 800, step1_s)
    later = sorted(draft.calls[-100:])
    # before: locked at width 3 for good (its records of 5 tokens and more kept their slow times),
    # 2.09 plain steps' worth; after: widths 5-7, 2.37
    assert later[len(later) // 2] >= 5, later
    assert tokens / seconds * step1_s > 2.2


def test_a_decoder_shares_step_times_between_its_generations(target):
    dec = KwkDecoder(target, max_cache_len=128)
    first = run(dec, REPEATS)
    assert (
        dec._solo_costs.step1_s > 0 and dec._solo_costs.relative
    )  # plain and verify steps were timed
    dec.reset()
    assert torch.equal(run(dec, REPEATS), first)  # the shared costs change only how it proposes


def test_a_draft_cost_measured_by_earlier_sequences_is_not_forgotten():
    draft, costs = FakeDraft(), StepCosts(step1_s=0.004, relative={2: 1.125, 3: 1.25})
    source, cands = Speculator(None, draft, costs=costs).propose([1, 2, 3], room=8)
    # not measured: tried, at a width where a draft can pay
    assert source == "draft" and len(cands) == Speculator.FIRST_DRAFT_WIDTH
    # an earlier sequence found a 4-token proposal costs 20 target steps
    costs.draft_call[id(draft.draft)] = {4: 20.0}
    assert Speculator(None, draft, costs=costs).propose([1, 2, 3], room=8) == (None, [])
    assert (
        Speculator(None, FakeDraft(), costs=costs).propose([1, 2, 3], room=8)[0] == "draft"
    )  # another draft: tried


def test_a_drafts_acceptance_carries_over_to_the_next_sequence():
    draft, costs = (
        FakeDraft(),
        StepCosts(step1_s=0.004, relative={fed: 1.1 for fed in range(2, 10)}),
    )
    costs.draft_call[id(draft.draft)] = {4: 3.0}  # pays only if nearly all its tokens are accepted
    first = Speculator(None, draft, costs=costs)
    # the 0.6 prior does not pay, even at the hopeful bound of a generation's first proposal
    assert first.propose([1, 2, 3], room=8) == (None, [])
    first.accept["draft"] = 0.95
    first.feedback("draft", 4, 4, 5, 0.0045, None)
    second = Speculator(None, draft, costs=costs)
    assert second.accept["draft"] == first.accept["draft"] > 0.9
    assert second.propose([1, 2, 3], room=8)[0] == "draft"  # at once, not after a probe's wait


def test_draft_call_costs_are_a_fixed_part_and_a_part_per_token():
    costs = StepCosts()
    costs.draft_call[1] = {4: 2.0}  # by the draft of id 1
    assert costs.draft_cost(1, 2) == pytest.approx(1.0)  # one width measured: proportional
    costs.draft_call[1][2] = 1.6  # 1.2 a call + 0.2 a token
    assert costs.draft_cost(1, 3) == pytest.approx(1.8)  # between: on their line
    assert costs.draft_cost(1, 8) == pytest.approx(2.8)  # beyond: along it
    assert costs.draft_cost(1, 1) == pytest.approx(1.4)
    # a width timed once at a slow moment: bounded by what the others say (5 / 4 of width 4's)
    costs.draft_call[1][5] = 9.0
    assert costs.draft_cost(1, 5) == pytest.approx(2.5)


def test_a_width_first_timed_with_a_one_time_cost_is_proposed_again():
    """The first proposal pays a one-time cost (3 target steps: the pruned head's set-up did, before
    it moved out of the timed proposal): its width must not look that dear for good. The machine:
    a k-token proposal costs 0.1 + 0.1 k target steps, a verify step 1 + 0.05 per extra token, 95%
    of the draft's tokens are accepted; the best width is 6 or more."""
    step1_s = 0.01
    clock = Clock()
    first = [True]

    def call(k):
        extra, first[0] = 3.0 if first[0] else 0.0, False
        return 0.1 + 0.1 * k + extra

    draft = SimulatedDraft(clock, call, step1_s, agree=0.95)
    spec = Speculator(None, draft, clock=clock)
    tokens, seconds = simulate(spec, draft, lambda fed: 1 + 0.05 * (fed - 1), 400, step1_s)
    later = draft.calls[len(draft.calls) // 2 :]
    # locked at width 3 (2.4x) when width 4's first time ruled it out
    assert draft.calls[0] == Speculator.FIRST_DRAFT_WIDTH and sorted(later)[len(later) // 2] >= 6
    assert tokens / seconds * step1_s > 2.7


def test_a_long_catch_up_is_timed_apart_from_the_proposal():
    draft = FakeDraft(behind=1)
    spec = Speculator(None, draft, costs=StepCosts(step1_s=0.01))
    spec._learn_draft_cost(3, 0.02)  # a short catch-up: all of it is the width's cost
    assert spec._draft_calls == {3: 0.02 / 0.01} and spec.catch_up_cost == Speculator.CATCH_UP_PRIOR
    draft.behind, draft.catch_up_s = 31, 0.03  # 30 tokens prefilled apart, then the proposal's feed
    spec._learn_draft_cost(5, 0.06)
    assert spec._draft_calls == {3: 2.0, 5: pytest.approx(3.0)}
    assert spec.catch_up_cost == pytest.approx(0.1)
