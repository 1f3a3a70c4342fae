"""Counter-based randomness: every random number is a pure function of
(request seed, position, stream).

Nothing here keeps state, so a token drawn at a position is reproduced by a
retry, a preemption or a re-run on another worker, and the scheduler (which
imports no torch) can compute the same numbers as the worker.

``mix_seed(seed, position)`` is the SplitMix64 finaliser applied to
``seed * golden + position``. Streams re-key the seed first,
``key = mix_seed(seed, STREAM_x)``, with stream tags far above any position,
and then draw ``mix_seed(key, position)``: the sampler's uniform (the
target's token, ``dspark.worker.sampler``), the speculative step's acceptance
uniforms, residual samples and draft samples are independent of each other.
"""
from __future__ import annotations

_MASK64 = (1 << 64) - 1

# Stream tags (ASCII, well above any token position).
STREAM_ACCEPT = 0x4143_4345_5054  # "ACCEPT": u_i of the accept test u < q/p
STREAM_RESIDUAL = 0x5245_5349_4455  # "RESIDU": the sample from normalize(max(0, q - p))
STREAM_DRAFT = 0x4452_4146_5400  # "DRAFT": the drafter's sample from p
STREAM_SAMPLE = 0x5341_4D50_4C45  # "SAMPLE": the target's token (the sampler's draw)


def mix_seed(seed: int, position: int) -> int:
    """SplitMix64-style mix of (seed, position) into a 63-bit generator seed."""
    z = (int(seed) * 0x9E3779B97F4A7C15 + int(position) + 0x632BE59BD9B4E019) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) & ((1 << 63) - 1)


def uniform(seed: int, position: int, stream: int) -> float:
    """U(0, 1), open at both ends, for (seed, position) in a stream: the top
    53 bits of the mixed value, centred in their bin (exactly representable)."""
    z = mix_seed(mix_seed(seed, stream), position)
    return ((z >> 10) + 0.5) / (1 << 53)
