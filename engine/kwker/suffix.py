"""Deprecated: kwker.speculative.lookup has the suffix automata (SuffixCache, Follower and
SuffixAutomaton, also importable from kwker.speculative)."""

from kwker._deprecation import moved_module
from kwker.speculative.lookup import Follower, SuffixAutomaton, SuffixCache

moved_module(__name__, "kwker.speculative.lookup")
__all__ = ["Follower", "SuffixAutomaton", "SuffixCache"]
