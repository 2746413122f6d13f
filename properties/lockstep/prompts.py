"""Token ids for prefix-caching worlds (docs/contract.md §8), as the harness sees them.

Each request has a token sequence: its prompt, then what it "generates". A generated
token is a function of the whole prefix before it (greedy decoding of a model that
does not exist), so two requests with one prefix go on alike and their later blocks
can be hit too. The value the data oracle writes for position p is a rolling hash of
tokens[0:p+1]: it depends on the prefix alone, so a request that hits another's
blocks reads back exactly the values it would have written, and a hit on the wrong
block shows as a wrong value (§8's data level).

Programs write prompts in symbols of a small vocabulary (`VOCAB`), so that prompts
drawn apart still share blocks; each world maps the symbols to token ids spread over
[0, 2**31 - 1) (`WorldConfig.vocabulary`, drawn by lockstep/strategies.py), and both
sides see only the ids, so every bit of an id matters to a block's key. Everything
here keeps symbols; `ids` is the one crossing.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from blocktable.properties.lockstep import events
from blocktable.reference import prefix as reference_prefix
from blocktable.reference.keys import block_key

VOCAB = 4  # a small vocabulary, so that prompts drawn apart still share blocks
_MODULUS = 2**61 - 1  # values stay positive and far from the oracle's negative sentinels
_MULTIPLIER = 1_000_003
_SEED = 0x9E3779B97F4A7C15 % _MODULUS


class Prompts:
    """Every request's tokens (as symbols) and prefix hashes, kept by the harness
    (neither side). `vocabulary`: each symbol's token id; empty: a symbol is its id."""

    def __init__(self, vocabulary: Sequence[int] = ()) -> None:
        if vocabulary and len(vocabulary) < VOCAB:
            raise ValueError(f"a vocabulary maps {VOCAB} symbols, got {len(vocabulary)} ids")
        self.vocabulary = tuple(vocabulary)
        self.tokens: dict[int, list[int]] = {}
        self._hashes: dict[int, list[int]] = {}
        self.seen: list[list[int]] = []  # every request's tokens, finished ones too: sources of new prompts
        self.seen_at_reset = 0  # how many there were at the last reset of the prefix cache

    def add(self, rid: int, prompt: list[int]) -> None:
        self.tokens[rid] = []
        self._hashes[rid] = []
        self.seen.append(self.tokens[rid])  # the same list: it grows as the request does
        for token in prompt:
            self._push(rid, token)

    def fork(self, parent: int, child: int) -> None:
        self.tokens[child] = list(self.tokens[parent])
        self._hashes[child] = list(self._hashes[parent])
        self.seen.append(self.tokens[child])

    def drop(self, rid: int) -> None:
        del self.tokens[rid], self._hashes[rid]

    def _push(self, rid: int, token: int) -> None:
        hashes = self._hashes[rid]
        before = hashes[-1] if hashes else _SEED
        self.tokens[rid].append(token)
        hashes.append((before * _MULTIPLIER + token + 1) % _MODULUS)

    def ids(self, symbols: Sequence[int]) -> list[int]:
        """The token ids the sides see for these symbols."""
        if not self.vocabulary:
            return list(symbols)
        if any(not 0 <= s < len(self.vocabulary) for s in symbols):
            raise ValueError(f"a prompt's symbols lie in 0 .. {len(self.vocabulary) - 1}, got {list(symbols)}")
        return [self.vocabulary[s] for s in symbols]

    def upto(self, rid: int, n: int) -> list[int]:
        """The request's first n tokens, generating as many as it lacks."""
        while len(self.tokens[rid]) < n:
            self._push(rid, self._hashes[rid][-1] % VOCAB)
        return self.tokens[rid][:n]

    def values(self, rid: int, start: int, stop: int) -> np.ndarray:
        """The oracle's values for positions [start, stop): each a hash of its whole prefix."""
        self.upto(rid, stop)
        return np.array(self._hashes[rid][start:stop], dtype=np.int64) + 1


def prompt_from(seen: list[list[int]], source: int, cut: int, extra: list[int], max_len: int,
                block: int = 1) -> list[int]:
    """A new prompt that extends or branches from an earlier request's tokens: `source`
    picks one, modulo one more than there are (that one: a fresh prompt), `cut` tokens
    come off its end, then it is cut back to whole blocks of `block` tokens (a prompt
    that ends on a block's end is where the len - 1 rule holds a hit back), and
    `extra` go on. At least one token, at most max_len."""
    index = source % (len(seen) + 1)
    base = seen[index] if index < len(seen) else []
    keep = max(0, len(base) - cut)
    prompt = (base[:keep - keep % block] + extra)[:max_len]
    return prompt or [source % VOCAB]


def lookup_events(groups: Sequence, prompt: list[int]) -> list[str]:
    """What a lookup of `prompt` on the reference's groups (before the add) reaches:
    hits on freed and on in-use blocks, and whether the hit length was held back by
    the len - 1 rule or by another group. Read-only."""
    L = reference_prefix.find_prefix(groups, prompt)
    pool = groups[0].pool
    labels = []
    refs = [int(pool.ref[pool.first_cached(block_key(s.group, prompt, j, s.tokens_per_block))])
            for s in groups for j in range(L // s.tokens_per_block)]
    if any(r == 0 for r in refs):
        labels.append(events.HIT_FREED)
    if any(r > 0 for r in refs):
        labels.append(events.HIT_IN_USE)
    # One more token lifts the len - 1 cap: a longer hit then means the cap held this one back.
    if reference_prefix.find_prefix(groups, prompt + [0]) > L:
        labels.append(events.HIT_CAPPED_BY_LENGTH)
    if len(groups) > 1 and max(reference_prefix.find_prefix([s], prompt) for s in groups) > L:
        labels.append(events.HIT_CAPPED_BY_GROUP)
    return labels


def noise(salt: int, n: int) -> list[int]:
    """n tokens of the vocabulary, a fixed function of `salt` (so a program records the
    prompt it made, and shrinking `n` keeps its start)."""
    rng = np.random.default_rng(salt)
    return [int(t) for t in rng.integers(0, VOCAB, size=n)]
