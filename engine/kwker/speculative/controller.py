"""The controller: which source proposes, and how many tokens, at each step, by expected tokens
per unit of time (a bandit over lookup and the draft, each arm with its record of acceptance)."""

from __future__ import annotations

import math
import time

from kwker.speculative.costs import StepCosts
from kwker.speculative.draft import DraftProposer
from kwker.speculative.lookup import LookupProposer
from kwker.speculative.verify import accept


class Speculator:
    """Chooses a source and how many tokens to propose, by expected tokens per unit of time.

    Per source it keeps an estimate of the chance that the next proposed token is accepted (`a`,
    a moving average): its record. Proposing k tokens yields 1 + a + a^2 + ... + a^k tokens for the
    cost of a (k+1)-token step (plus the draft's k-token proposal for the draft), both from
    StepCosts: it proposes the k with the best ratio, and nothing when no k beats a plain step by
    the source's margin. Until the 1-token step that every cost is relative to has been measured,
    steps are plain. The costs can come from earlier sequences (`costs`): a generation then starts
    with the widths, the draft costs and the draft's acceptance they measured.

    A draft cannot lock itself out:
    - with no measured cost it first proposes FIRST_DRAFT_WIDTH tokens, a width at which a draft of
      a few tenths of a step can pay (one token rarely does);
    - while this generation has tested few of its tokens, its widths are chosen at an upper bound
      of its acceptance (HOPE standard errors over the estimate, which counts as HOPE_PRIOR_TRIALS
      trials), as a bandit's upper confidence bound: a few unlucky first proposals do not hold it
      off a text it would serve well, and the bound closes on the estimate as trials come in;
    - while its record does not pay, it is probed at least PROBE_GAP steps after its latest
      proposal, at the width that would pay best at PROBE_ACCEPT (at least PROBE_MIN_WIDTH): a
      generation's first probe if it is expected to cost at most PROBE_FIRST_COST plain steps,
      later ones while all probes together cost at most PROBE_SHARE of the generation's time. A
      probe's cost counts its draft call, its catch-up on the tokens the draft sat out (at most
      PROBE_WINDOW of them) and its verify step, less the tokens it gained.

    Lookup's record is kept per bucket of match length (MATCH_BUCKETS): a text being copied is
    accepted far more often than a common pair of words. After a match of LONG_MATCH tokens it may
    propose up to LONG_LOOKUP times its limit. While it does not propose, its continuation (the
    shadow) is checked against the step's tokens, so that its record keeps learning and it comes
    back when the text starts repeating.

    With tree, a branch beside the draft's chain shares the chain's first i tokens and replaces
    the rest (the draft's runner-up at i, or lookup's continuation where it parts from the chain at
    i), verified in the same step in a second slot (runner.Feed.branch_of): where the chain fails
    at i and the branch's token is the target's, the branch's rows go on from there. It is planned
    where the tokens it is expected to add beat the rows it adds to the step."""

    # plain steps timed before anything is proposed: the unit every cost is relative to (untuned)
    PLAIN_WARMUP = 2
    # the highest stop for a draft's proposal (the chance all its tokens are kept; perf-notes #26)
    STOP_MAX = 0.9
    # a new draft's first width: one token rarely pays for a draft's call (perf-notes #20)
    FIRST_DRAFT_WIDTH = 4
    # a probe's width is the best at this acceptance, a good draft's (perf-notes #20)
    PROBE_ACCEPT = 0.9
    # steps after the draft's latest proposal before it is probed (perf-notes #20)
    PROBE_GAP = 8
    # a probe's width, at least: its record may be a prior or another text's (perf-notes #20)
    PROBE_MIN_WIDTH = 3
    # plain steps a generation's first probe may cost: a new text may suit it (perf-notes #23)
    PROBE_FIRST_COST = 4.0
    # share of the time all probes may cost: >= 0.97x plain where drafts never pay (perf-notes #23)
    PROBE_SHARE = 0.02
    # tokens a probe catches up on, at most: else its cost grows with the steps sat out (#23, #27)
    PROBE_WINDOW = 48
    # a caught-up token's cost in 1-token target steps until one is measured (perf-notes #27)
    CATCH_UP_PRIOR = 0.05
    # hope over the draft's estimate, in standard errors; the trials it counts as (perf-notes #30)
    HOPE, HOPE_PRIOR_TRIALS = 0.75, 8
    # what a source must promise over a plain step: noise in its measured costs (untuned)
    DRAFT_MARGIN, LOOKUP_MARGIN = 1.05, 1.02
    # lookup's match-length buckets (1, 2-3, 4-7, 8-15, 16+): length predicts (perf-notes #39)
    MATCH_BUCKETS = (1, 2, 4, 8, 16)
    # a match this long is a copy: its first token was kept 96% of the time (perf-notes #39)
    LONG_MATCH = 16
    # times its limit lookup may propose after a long match (untuned)
    LONG_LOOKUP = 3
    # prior chance that the draft's runner-up is the target's where its top is not (perf-notes #27)
    RUNNER_UP = 0.4

    def __init__(
        self,
        lookup: LookupProposer | None,
        draft: DraftProposer | None,
        lookup_max: int = 8,
        draft_max: int = 8,
        costs: StepCosts | None = None,
        clock=time.perf_counter,
        tree: bool = False,
    ):
        """clock: what times the draft's proposals (a test's simulated clock). tree: plan a branch
        beside the draft's chain (see RUNNER_UP); the caller verifies it where it has a slot for it
        (`branch` after each propose)."""
        self.lookup, self.draft = lookup, draft
        self.tree = tree
        self.branch: tuple[int, list[int]] | None = None  # (i, tokens): replaces the chain's [i:]
        self.runner_up = self.RUNNER_UP  # learnt: see branch_feedback
        self._branch_is_runner_up = False  # whether `branch` is the draft's runner-up
        self.limit = {"lookup": lookup_max, "draft": draft_max}
        # prior chance that a proposed token is accepted
        self.accept = {"lookup": 0.5, "draft": 0.6}
        self._draft_key = id(draft.draft) if draft is not None else None
        if costs is not None and self._draft_key in costs.draft_accept:
            self.accept["draft"] = costs.draft_accept[self._draft_key]
        self.costs = costs if costs is not None else StepCosts()
        # lookup's acceptance per bucket of match length (MATCH_BUCKETS): not carried over from
        # the earlier sequences, whose kind of text may differ (perf-notes #32)
        self.match_accept: dict[int, float] = {}
        self._bucket: int | None = None  # of the lookup proposal (or shadow) of this step
        self.clock = clock
        # an earlier sequence measured the 1-token step: no plain warm-up
        self._inherited = self.costs.step1_s > 0
        self.draft_s = 0.0
        self.meter = None  # the sequence's SpeedupMeter, which may ask for a plain step
        # lookup's continuation where it was found and not proposed: checked against the step's
        # tokens (feedback), so lookup's records keep learning while it sits out
        self._shadow: list[int] | None = None
        self._plain_steps = 0
        self._steps = 0
        # the first probe comes PROBE_GAP steps in: a record inherited from earlier sequences is
        # not doubted at once
        self._next_probe, self._probing, self._probed = self.PROBE_GAP, False, False
        # this generation's time, and what its probes cost, in 1-token steps of the moment
        self._elapsed = self._probe_spent = 0.0
        self._spent_drafting = 0.0  # the draft's time in this step, in 1-token steps
        self._draft_trials = 0  # the draft's tokens this generation has tested (see HOPE)

    @property
    def _draft_calls(self) -> dict[int, float]:
        return self.costs.draft_call.setdefault(self._draft_key, {})

    @property
    def catch_up_cost(self) -> float:
        """A caught-up token's time relative to a 1-token target step (CATCH_UP_PRIOR until
        measured)."""
        return self.costs.draft_catch_up.get(self._draft_key, self.CATCH_UP_PRIOR)

    def _draft_call(self, k: int) -> float | None:
        """This draft's k-token proposal's time relative to a 1-token target step (None before any
        width was measured): StepCosts.draft_cost."""
        return self.costs.draft_cost(self._draft_key, k)

    def _ratio(
        self, source: str, k: int, accept: float | None = None, catch_up: float = 0.0
    ) -> float:
        """Expected tokens per unit of time (a plain step: 1) when `source` proposes k tokens,
        counting `catch_up` tokens of the draft's catch-up in its time."""
        a = self.accept[source] if accept is None else accept
        extra = self.catch_up_cost * catch_up
        if source == "draft":
            extra += self._draft_call(k) or 0.0
        return _expected_tokens(a, k) / (self.costs.step_cost(k + 1) + extra)

    def _lookup_accept(self, bucket: int | None) -> float:
        """Lookup's acceptance after a match of that bucket (its overall record until the bucket
        has one)."""
        return self.match_accept.get(bucket, self.accept["lookup"])

    def _best_k(
        self, source: str, room: int, accept: float | None = None, long: bool = False
    ) -> int:
        """The width with the best expected ratio, 0 if none beats a plain step by the source's
        margin. long: after a long match (lookup)."""
        best_k, best = 0, 1.0
        top = min(self.limit[source] * (self.LONG_LOOKUP if long else 1), room)
        if source == "lookup":
            # Only step sizes already measured, and one more: lookup's proposals cost nothing but
            # their step, and where a wide step costs nearly as much as several narrow ones
            # (compute-bound formats, big models) they grow only as far as they are seen to pay
            # (twice as fast after a long match).
            widest = max(self.costs.relative, default=1)
            top = min(top, 2 * widest if long else widest)
        elif not self._draft_calls:
            return min(self.FIRST_DRAFT_WIDTH, top)  # a new draft: tried at a width that can pay
        margin = self.DRAFT_MARGIN if source == "draft" else self.LOOKUP_MARGIN
        for k in range(1, top + 1):
            ratio = self._ratio(source, k, accept)
            if ratio > best * margin and ratio > best:
                best_k, best = k, ratio
        return best_k

    def _hopeful_accept(self) -> float:
        """The draft's acceptance at its upper bound (HOPE), never above the estimate or
        PROBE_ACCEPT, whichever is higher."""
        a = self.accept["draft"]
        bound = a + self.HOPE * math.sqrt(
            a * (1 - a) / (self.HOPE_PRIOR_TRIALS + self._draft_trials)
        )
        return min(bound, max(a, self.PROBE_ACCEPT))

    def _stop_below(self, k: int) -> float:
        """Where a draft proposing up to k tokens stops (DraftProposer.propose's min_prob): one more
        token is worth the chance that every token before it is kept (the product of the draft's
        own probabilities) times the chance that it is (the draft's acceptance), and costs a draft
        token and a verify row; it is proposed while its worth per cost beats the tokens per unit of
        time that the k-token plan expects. 0 (no stop) before the draft's cost was measured."""
        call = self._draft_call(k)
        if call is None:
            return 0.0
        draft_token = call - (self._draft_call(k - 1) or 0.0) if k > 1 else call
        row = self.costs.step_cost(k + 1) - self.costs.step_cost(k)
        worth = self.accept["draft"]
        return min(self.STOP_MAX, self._ratio("draft", k) * (draft_token + row) / max(worth, 0.05))

    def _probe_k(self, room: int) -> int:
        """The width of a probe of the draft: the best at PROBE_ACCEPT, and never less than
        PROBE_MIN_WIDTH (a probe is made even where the draft's measured costs say it cannot
        pay)."""
        k = self._best_k("draft", room, accept=self.PROBE_ACCEPT)
        return min(max(k, self.PROBE_MIN_WIDTH), self.limit["draft"], room)

    def _probe_due(self, tokens: list[int], k: int) -> bool:
        """Whether a probe of k tokens fits (PROBE_*): its expected cost in 1-token steps, catch-up
        included, against the first probe's allowance or the budget."""
        if self._steps < self._next_probe:
            return False
        # measured: a draft with no measured width is not probed, it proposes FIRST_DRAFT_WIDTH
        cost = (
            self._draft_call(k)
            + self.catch_up_cost * self.draft.behind_on(tokens, self.PROBE_WINDOW)
            + self.costs.step_cost(k + 1)
            - 1.0
        )
        if not self._probed and cost <= self.PROBE_FIRST_COST:
            return True
        return self._probe_spent + cost <= self.PROBE_SHARE * (self._elapsed + cost)

    def _reference_due(self) -> bool:
        """Whether this step should be plain for the speedup's reference (kwker.speedup)."""
        return self.meter is not None and self.meter.wants_plain()

    def propose(self, tokens: list[int], room: int) -> tuple[str | None, list[int]]:
        """(source, tokens) to verify after the text; room = how many may be proposed at most.
        With tree, `branch` is then the branch to verify beside them, if one pays."""
        self._shadow = None
        self.branch = None
        if room <= 0:
            return None, []
        if self._reference_due():
            return None, []  # a reference step
        warm = self._plain_steps >= self.PLAIN_WARMUP or self._inherited
        cont, found, found_accept = self._lookup_proposal(tokens, room, warm)
        self._probing = False
        k = self._draft_width(tokens, room, found, found_accept) if warm else 0
        if k:
            if found:  # lookup keeps learning whether it would have been right
                self._shadow = cont
            cands = self._run_draft(tokens, k, room, cont, found_accept)
            if cands:
                return "draft", cands
        if found:
            return "lookup", found
        return None, []

    def _lookup_proposal(
        self, tokens: list[int], room: int, warm: bool
    ) -> tuple[list[int], list[int], float]:
        """(lookup's continuation, the part of it that pays, its expected acceptance): both empty
        where lookup found nothing; a continuation that does not pay is the step's shadow."""
        cont: list[int] = []
        found: list[int] = []
        found_accept = self.accept["lookup"]
        self._bucket = None
        if self.lookup is None:
            return cont, found, found_accept
        where = self.lookup.find(tokens, min(room, self.limit["lookup"] * self.LONG_LOOKUP))
        if where is None:
            return cont, found, found_accept
        cont, length = where
        self._bucket = max(b for b in self.MATCH_BUCKETS if b <= length)
        found_accept = self._lookup_accept(self._bucket)
        long = length >= self.LONG_MATCH
        k = self._best_k("lookup", room, found_accept, long) if warm else 0
        if k:
            found = cont[:k]
        else:
            self._shadow = cont
        return cont, found, found_accept

    def _draft_width(
        self, tokens: list[int], room: int, found: list[int], found_accept: float
    ) -> int:
        """How many tokens the draft proposes this step (0: none): the width its record pays
        best, where it beats lookup's proposal `found`; else a probe's width, where one is due."""
        if self.draft is None:
            return 0
        k = self._best_k("draft", room, accept=self._hopeful_accept())
        if k:
            # Against lookup: every token a lookup step gives, the draft must catch up on when it
            # next proposes, so lookup's step counts their catch-up. What the draft is behind
            # already is owed whichever proposes now, so it is not charged to the draft
            # (perf-notes #36).
            if not found:
                return k
            gain = _expected_tokens(found_accept, len(found))
            draft = self._ratio("draft", k)
            lookup = self._ratio("lookup", len(found), found_accept, catch_up=gain)
            return k if draft > lookup else 0
        # a probe where the draft's own record does not pay (where it pays but lookup promises
        # more, the records decide), even where lookup has a proposal: a text that repeats its
        # prompt may be the draft's best ground too
        probe = self._probe_k(room)
        if self._probe_due(tokens, probe):
            self._probing = True
            return probe
        return 0

    def _run_draft(
        self, tokens: list[int], k: int, room: int, cont: list[int], cont_accept: float
    ) -> list[int]:
        """The draft's proposal of up to k tokens, timed: its cost is learnt, and with tree the
        branch beside it planned (cont: lookup's continuation, as a branch's candidate)."""
        t0 = self.clock()
        window = self.PROBE_WINDOW if self._probing else None
        cands = self.draft.propose(tokens, k, window, self._stop_below(k), self.tree)
        spent = self.clock() - t0
        self.draft_s += spent
        self._spent_drafting = spent / self.costs.step1_s
        if cands:
            self._learn_draft_cost(len(cands), spent)
            if self.tree and self.draft.probs:
                self.branch = self._plan_branch(cands, room, cont, cont_accept)
        return cands

    def start(self, tokens: list[int]) -> None:
        """A new text's prompt is in the target's cache: the draft reads it too
        (DraftProposer.read), as part of the prefill."""
        if self.draft is not None:
            self.draft.read(tokens)

    def _plan_branch(
        self, cands: list[int], room: int, cont: list[int], cont_accept: float
    ) -> tuple[int, list[int]] | None:
        """The branch beside the draft's chain `cands` that adds the most tokens per unit of time,
        None if none adds more than it costs. The draft's probabilities (well calibrated: perf-notes
        #26) give the chance that the chain fails exactly at i; the runner-up is then right
        runner_up of the time, lookup's tokens as its record after a match of that length says."""
        probs, second = self.draft.probs, self.draft.second
        n = len(cands)
        expected = 1.0 + sum(math.prod(probs[: i + 1]) for i in range(n))  # the chain's tokens
        cost = self.costs.step_cost(n + 1) + (self._draft_call(n) or 0.0)
        best, plan = expected / cost, None
        for i in range(n):
            fails_here = math.prod(probs[:i]) * (1.0 - probs[i])
            options = [([second[i]], self.runner_up, True)]
            if len(cont) > i and cont[:i] == cands[:i] and cont[i] != cands[i]:
                options.append((cont[i : i + self.limit["lookup"]], cont_accept, False))
            for tokens, right, runner_up in options:
                tokens = tokens[: max(0, room - i)]
                if not tokens:
                    continue
                gain = fails_here * sum(right**j for j in range(1, len(tokens) + 1))
                rows = self.costs.step_cost(n + 1 + len(tokens)) - self.costs.step_cost(n + 1)
                ratio = (expected + gain) / (cost + rows)
                if ratio > best:
                    best, plan = ratio, (i, tokens)
                    self._branch_is_runner_up = runner_up
        return plan

    def branch_feedback(self, right: bool) -> None:
        """The chain failed where the branch starts: whether the branch's token was the target's
        (learnt for the draft's runner-up; lookup's tokens keep their own record)."""
        if self._branch_is_runner_up:
            self.runner_up = _ema(self.runner_up, float(right), weight=0.1)

    def _learn_draft_cost(self, k: int, spent: float) -> None:
        """A k-token proposal took `spent` seconds: of them the draft's catch-up took catch_up_s (a
        long one: its cost per token), the rest is the width's cost."""
        step1, catch_s = self.costs.step1_s, self.draft.catch_up_s
        calls = self._draft_calls
        calls[k] = _ema(calls.get(k, 0.0), (spent - catch_s) / step1)
        if catch_s > 0:
            key, per_token = self._draft_key, catch_s / step1 / max(1, self.draft.behind - 1)
            self.costs.draft_catch_up[key] = _ema(
                self.costs.draft_catch_up.get(key, 0.0), per_token
            )

    def feedback(
        self,
        source: str | None,
        proposed: int,
        accepted: int,
        fed: int,
        seconds: float,
        new: list[int] | None,
    ) -> None:
        """After a verify step: what was accepted, how long the step took, and the tokens it gave
        (the target's own, in order: for the shadow check of lookup)."""
        if self.costs.step1_s:
            step = seconds / self.costs.step1_s + self._spent_drafting
            self._elapsed += step
            if self._probing:  # what the probe cost beyond the plain step, less what it gained
                self._probe_spent += max(0.0, step - 1.0 - accepted)
        self._spent_drafting = 0.0
        if fed == 1:
            self.costs.step1_s = _ema(self.costs.step1_s, seconds)
            self._plain_steps += 1
        elif self.costs.step1_s:
            self.costs.record(fed, seconds / self.costs.step1_s)
        self._steps += 1
        if source is not None and proposed:
            trials = self._learn(source, accepted, proposed)
            if source == "draft":
                self.costs.draft_accept[self._draft_key] = self.accept["draft"]
                self._draft_trials += trials
        if source == "draft":
            self._probed = self._probed or self._probing
            self._next_probe = self._steps + self.PROBE_GAP
        if self._shadow and new:
            # learnt as from lookup's own proposal, over as many tokens as the step gave, not its
            # first alone: else the record of long matches rises too slowly to win back a copy
            # from the draft (perf-notes #36)
            self._learn("lookup", accept(self._shadow, new), min(len(self._shadow), len(new)))

    def _learn(self, source: str, kept: int, tested: int) -> int:
        """Learns `source`'s acceptance from `tested` tokens it proposed (or, for lookup's shadow,
        would have), the first `kept` of them kept: kept successes, then one failure unless all
        were kept, at weight 0.1 a trial (at most 0.5). Returns the trials counted."""
        trials = kept + (1 if kept < tested else 0)
        if trials:
            weight = min(0.5, 0.1 * trials)
            self.accept[source] = _ema(self.accept[source], kept / trials, weight=weight)
            if source == "lookup" and self._bucket is not None:
                self._learn_match(kept / trials, weight)
        return trials

    def _learn_match(self, accepted: float, weight: float) -> None:
        """Lookup's acceptance after a match of this step's bucket."""
        self.match_accept[self._bucket] = _ema(
            self._lookup_accept(self._bucket), accepted, weight=weight
        )


def _expected_tokens(accept: float, k: int) -> float:
    """The tokens a step that verifies k proposed tokens gives, when each is accepted with chance
    `accept` after the one before it was: 1 + a + a^2 + ... + a^k (the target's own token last)."""
    return sum(accept**i for i in range(k + 1))


def _ema(old: float, new: float, weight: float = 0.2) -> float:
    return new if old == 0.0 else old + weight * (new - old)
