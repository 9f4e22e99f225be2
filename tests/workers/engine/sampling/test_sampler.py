"""workers/engine/sampling/sampler.py: temperature 0 is the argmax, a seed repeats its draws whatever
shares the batch, top_p keeps only the smallest prefix reaching its mass."""

from __future__ import annotations

import numpy as np

from bench.sampling import whole_sort_choice  # what sampler.py did before: the bench's baseline
from workers.engine.sampling.sampler import choose_tokens, make_generator
from workers.engine.types import SamplingParams

GREEDY = SamplingParams(max_tokens=1)


def _logits(rows: int, vocab: int = 50, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, vocab), dtype=np.float32)


def test_temperature_zero_is_the_argmax_and_has_no_generator() -> None:
    logits = _logits(4)
    assert make_generator(GREEDY) is None
    assert choose_tokens(logits, [GREEDY] * 4, [None] * 4) == logits.argmax(axis=-1).tolist()


def _draws(params: SamplingParams, logits: np.ndarray, steps: int = 20) -> list[int]:
    generator = make_generator(params)
    return [choose_tokens(logits[None], [params], [generator])[0] for _ in range(steps)]


def test_a_seeded_generator_repeats_and_another_seed_differs() -> None:
    logits = np.zeros(50, dtype=np.float32)  # uniform: every draw is up to the generator
    seeded = SamplingParams(max_tokens=1, temperature=1.0, seed=7)
    assert _draws(seeded, logits) == _draws(seeded, logits)
    assert _draws(seeded, logits) != _draws(SamplingParams(max_tokens=1, temperature=1.0, seed=8), logits)


def test_a_seeded_row_draws_the_same_batched_or_alone() -> None:
    params = SamplingParams(max_tokens=1, temperature=0.8, seed=3)
    logits = _logits(3)
    alone = [choose_tokens(logits[1:2], [params], [make_generator(params)])[0]]
    others = [GREEDY, SamplingParams(max_tokens=1, temperature=1.0, seed=99)]
    generators = [None, make_generator(params), make_generator(others[1])]
    batched = choose_tokens(logits, [GREEDY, params, others[1]], generators)
    assert batched[1] == alone[0] and batched[0] == int(logits[0].argmax())


def test_unseeded_generators_differ() -> None:
    params = SamplingParams(max_tokens=1, temperature=1.0)
    logits = np.zeros(1000, dtype=np.float32)
    assert _draws(params, logits) != _draws(params, logits)


def test_top_p_keeps_the_smallest_prefix_reaching_its_mass() -> None:
    # Probabilities ~0.6, 0.3, 0.1 at temperature 1: top_p 0.5 keeps the first only,
    # top_p 0.8 the first two.
    logits = np.log(np.array([0.3, 0.6, 0.1], dtype=np.float32))
    only_first = SamplingParams(max_tokens=1, temperature=1.0, top_p=0.5, seed=1)
    assert set(_draws(only_first, logits, 200)) == {1}
    two = SamplingParams(max_tokens=1, temperature=1.0, top_p=0.8, seed=1)
    assert set(_draws(two, logits, 200)) == {0, 1}


def test_low_temperature_concentrates_on_the_argmax() -> None:
    logits = np.array([1.0, 2.0, 1.5], dtype=np.float32)
    cold = SamplingParams(max_tokens=1, temperature=0.01, seed=5)
    assert set(_draws(cold, logits, 100)) == {1}
    hot = SamplingParams(max_tokens=1, temperature=2.0, seed=5)
    assert set(_draws(hot, logits, 300)) == {0, 1, 2}


def test_a_token_of_zero_probability_is_never_drawn() -> None:
    """Banned (-inf) tokens span no interval of the cumulative mass, with or without top_p."""
    logits = np.full(20, -np.inf, dtype=np.float32)
    logits[[3, 11]] = 0.0
    for top_p in (1.0, 0.99):
        params = SamplingParams(max_tokens=1, temperature=1.0, top_p=top_p, seed=2)
        assert set(_draws(params, logits, 300)) == {3, 11}


def test_draws_follow_the_distribution() -> None:
    """Probabilities 0.7 / 0.2 / 0.1: 4,000 seeded draws land within a few standard deviations."""
    logits = np.log(np.array([0.7, 0.2, 0.1], dtype=np.float32))
    draws = _draws(SamplingParams(max_tokens=1, temperature=1.0, seed=11), logits, 4000)
    shares = np.bincount(draws, minlength=3) / len(draws)
    assert np.allclose(shares, [0.7, 0.2, 0.1], atol=0.03), shares


def test_top_p_draws_what_sorting_the_whole_vocabulary_draws() -> None:
    """The nucleus search sorts only likely tokens; every draw must equal the whole sort's, for
    peaked and flat distributions, ties (on the nucleus' edge too), banned tokens and top_p near 1."""
    rng = np.random.default_rng(5)
    vocab = 4096
    shapes = {
        "peaked": rng.standard_normal(vocab) * 6,
        "flat": rng.standard_normal(vocab) * 0.05,
        "ties": np.round(rng.standard_normal(vocab) * 2),  # few distinct values: ties everywhere
        "uniform": np.zeros(vocab),
        "banned": np.where(rng.random(vocab) < 0.9, -np.inf, rng.standard_normal(vocab)),
    }
    for name, values in shapes.items():
        logits = values.astype(np.float32)
        for top_p in (0.05, 0.5, 0.9, 0.99, 0.999999):
            for temperature in (0.3, 1.0, 1.7):
                params = SamplingParams(max_tokens=1, temperature=temperature, top_p=top_p, seed=1)
                ours, theirs = make_generator(params), make_generator(params)
                assert ours is not None and theirs is not None
                for _ in range(25):
                    expected = whole_sort_choice(logits[None], [params], [theirs])
                    assert choose_tokens(logits[None], [params], [ours]) == expected, (name, top_p)
