"""Paired rounds: the 95 % bootstrap interval of a throughput ratio between two systems that
ran the same work in the same interleaved rounds.

Knows: one system's rounds as (tokens, seconds) windows beside the other's of the same
round; resampling whole rounds with replacement keeps each round's pair together, so the
minute a round ran in (a shared machine's load) moves both sides of it alike. Does not know:
servers, requests or what the systems are.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

Window = tuple[float, float]  # (tokens, seconds) of one round


def ratio_interval(
    pairs: Sequence[tuple[Window, Window]], draws: int = 2000, seed: int = 0
) -> tuple[float, float] | None:
    """The 2.5th and 97.5th percentiles of (summed tokens / summed seconds) of the first
    system over the second's, over `draws` resamplings of the rounds; None with fewer than
    three rounds with time on both sides (too few to resample)."""
    pairs = [(a, b) for a, b in pairs if a[1] and b[1]]
    if len(pairs) < 3:
        return None
    rng = random.Random(seed)
    ratios = []
    for _ in range(draws):
        pick = [pairs[rng.randrange(len(pairs))] for _ in pairs]
        ours = sum(a[0] for a, _ in pick) / sum(a[1] for a, _ in pick)
        theirs = sum(b[0] for _, b in pick) / sum(b[1] for _, b in pick)
        ratios.append(ours / theirs if theirs else 0.0)
    ratios.sort()
    return ratios[int(0.025 * draws)], ratios[int(0.975 * draws) - 1]
