"""Exact speculative decoding as named parts: propose -> verify -> accept -> rollback.

Proposers suggest the next tokens (propose); the target runs them all in ONE native step (verify:
the kernels are batch-invariant, so each row's logits are the bits a plain step would give); a
proposed token is kept iff it equals the token the target itself picks at that position (accept:
argmax, or the sample drawn with that position's one uniform number); the slot's cache forgets the
rejected tail (rollback: Runner.trim) and the next step overwrites it. So the output never depends
on proposals.

Sources, and how they combine: prompt lookup (free: copies what followed the longest earlier match
of the text's end) and the draft model each propose as their record of accepted tokens and their
cost promise; where both have a proposal, the one expecting more tokens per unit of time goes.

- lookup.py: LookupProposer, and the suffix automata it matches with (SuffixCache: a server's
  earlier texts);
- draft.py: DraftProposer, a small model's greedy proposal, over a pruned head;
- costs.py: StepCosts, what a decoder's steps and drafts cost, measured as it runs;
- controller.py: Speculator, which source proposes how many tokens at each step;
- verify.py: accept, how many proposed tokens are kept.

Glossary:
- proposal: the tokens a source suggests to follow the text, `k` of them (its width); they are
  only ever emitted once verified.
- source, or arm: lookup or the draft, the controller's choices (the arms of a bandit), each with
  its record: the chance that a proposed token is kept, given that the ones before it were.
- plain step: a 1-token step, nothing proposed; its time is the unit every cost is counted in.
- verify step: one target step that feeds the text's next token and the k proposed tokens
  (k + 1 rows) and returns each row's logits.
- accepted prefix: the proposed tokens, from the first, that equal the target's own picks.
- bonus token: the target's own pick after the accepted prefix: every verify step gives one, so a
  step gives accepted + 1 tokens.
- rollback: the slot's cache forgets the rejected tail (Runner.trim).
- step cost: a step's time over a plain step's of the moment (StepCosts.step_cost); a draft's
  proposal is counted the same way (StepCosts.draft_cost).
- catch-up: the text's tokens a draft reads before it proposes (the steps it sat out).
- probe: a draft's proposal where its record does not pay, on a budget, to see if it does now.
- shadow: lookup's continuation found but not proposed, checked against the step's tokens so
  that its record keeps learning.
- branch: with tree=True, a second candidate beside the draft's chain, verified in another slot.
"""

from kwker.speculative.controller import Speculator
from kwker.speculative.costs import StepCosts
from kwker.speculative.draft import DraftProposer
from kwker.speculative.lookup import Follower, LookupProposer, SuffixAutomaton, SuffixCache
from kwker.speculative.verify import accept

__all__ = [
    "DraftProposer",
    "Follower",
    "LookupProposer",
    "Speculator",
    "StepCosts",
    "SuffixAutomaton",
    "SuffixCache",
    "accept",
]
