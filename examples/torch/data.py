"""A deterministic synthetic language for the GPT example.

Text is drawn from a fixed random "grammar": a first-order Markov chain over
the vocabulary in which every token has only `BRANCHES` possible successors,
taken with the probabilities `PROBS`. The successor table comes from the seed,
so the language is the same on every rank and every run.

A model that has learned the chain predicts the next token with a
cross-entropy of H(PROBS) (about 0.94 nats), far below the ln(vocab) (5.5 nats
for 256 tokens) of a model that knows nothing; a small GPT gets most of the
way there in ~100 steps, so the loss curve visibly falls within a short CPU
run.

`batch(step, rank, world, batch_size, seq_len, seed)` is a pure function of
its arguments: sequence i of the whole run (i counts over steps, then ranks,
then the rows of one rank's batch) is generated from its own RNG seeded with
(seed, i). So a resumed run sees exactly the data it would have seen, each
rank gets different sequences, and the global batch of a step is the same
for `world` ranks of `batch_size` as for one rank of `world * batch_size`.
"""

from __future__ import annotations

import functools
import math

import torch

BRANCHES = 4
PROBS = (0.7, 0.15, 0.1, 0.05)  # Successor probabilities, the same for every token.
DEFAULT_VOCAB = 256


def entropy_floor() -> float:
    """The best achievable mean next-token loss (nats): the chain's entropy rate.

    Every token has the same successor distribution, so the rate is H(PROBS)
    (the first token of each sequence, drawn uniformly, is never a target).
    """
    return -sum(p * math.log(p) for p in PROBS)


@functools.lru_cache(maxsize=8)
def successor_table(vocab: int, seed: int) -> torch.Tensor:
    """[vocab, BRANCHES] LongTensor: the possible successors of each token."""
    if vocab < BRANCHES:
        raise ValueError(f"vocab {vocab} must be at least {BRANCHES}")
    gen = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(vocab, generator=gen)[:BRANCHES] for _ in range(vocab)])


def _sequence_seed(seed: int, index: int) -> int:
    # A simple, stable mix of (seed, index) into a 63-bit generator seed.
    return (seed * 0x9E3779B97F4A7C15 + index * 0xBF58476D1CE4E5B9 + 1) % (1 << 63)


def batch(
    step: int, rank: int, world: int, batch_size: int, seq_len: int, seed: int, vocab: int = DEFAULT_VOCAB
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank `rank`'s batch of step `step`: (inputs, targets), each [batch_size, seq_len] int64.

    targets[:, t] is the token that follows inputs[:, t] (inputs shifted by one).
    """
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is not in [0, world {world})")
    if step < 0 or batch_size < 1 or seq_len < 1:
        raise ValueError("step must be >= 0, batch_size and seq_len >= 1")
    succ = successor_table(vocab, seed)
    cum = torch.tensor(PROBS, dtype=torch.float64).cumsum(0)
    first = (step * world + rank) * batch_size  # Index of this batch's first sequence.

    starts, choices = [], []
    for i in range(first, first + batch_size):
        gen = torch.Generator().manual_seed(_sequence_seed(seed, i))
        starts.append(torch.randint(vocab, (1,), generator=gen))
        # Which of the BRANCHES successors each transition takes.
        u = torch.rand(seq_len, generator=gen, dtype=torch.float64)
        choices.append(torch.searchsorted(cum, u).clamp_(max=BRANCHES - 1))
    choices = torch.stack(choices)  # [batch_size, seq_len]

    tokens = torch.empty(batch_size, seq_len + 1, dtype=torch.long)
    tokens[:, 0] = torch.cat(starts)
    for t in range(seq_len):  # Walk the chain, all rows at once.
        tokens[:, t + 1] = succ[tokens[:, t], choices[:, t]]
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
