"""The verify step's rule, on which exactness rests: a proposed token is kept iff it equals the
token the target itself picks at its position (argmax, or the sample drawn with that position's one
uniform number), so the text never depends on what was proposed."""


def accept(candidates: list[int], picks: list[int]) -> int:
    """How many proposed tokens are kept: the run of candidates, from the first, that equals the
    target's own picks (picks[i]: the token the target chooses after the text + candidates[:i])."""
    n = 0
    while n < len(candidates) and n < len(picks) and candidates[n] == picks[n]:
        n += 1
    return n
