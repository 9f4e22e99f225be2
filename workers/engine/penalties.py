"""Per-row logit adjustments of one batched step: min_tokens, logit_bias, then the penalties.

The order is vLLM v1's sampler's: min_tokens masks the end-of-sequence tokens, logit_bias adds to
the named tokens, then repetition, frequency and presence penalties. Each is one tensor operation
over the rows that ask for it (no Python loop over tokens), and each row reads only its own
prompt and completion, so a row's adjusted logits do not depend on what shares its batch: batched
output stays equal to solo output.

repetition_penalty follows vLLM (and the CTRL paper): a token seen in the prompt or the completion
has a positive logit divided by it and a negative one multiplied by it. frequency_penalty and
presence_penalty follow OpenAI: logit -= frequency * count + presence * (count > 0), counting the
completion only.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence

import torch

from workers.engine.types import SamplingParams


def adjusts(params: SamplingParams) -> bool:
    """Whether these parameters change any logit (rows that do not skip all of this)."""
    return bool(
        params.min_tokens
        or params.logit_bias
        or params.presence_penalty
        or params.frequency_penalty
        or params.repetition_penalty != 1.0
    )


def adjust_logits(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    eos_ids: Collection[int],
) -> torch.Tensor:
    """The logits [rows, vocab] to choose from: `logits` itself when no row adjusts, else an fp32 copy."""
    rows = [row for row, row_params in enumerate(params) if adjusts(row_params)]
    if not rows:
        return logits
    index = torch.tensor(rows, device=logits.device)
    chosen = [params[row] for row in rows]
    selected = logits.index_select(0, index).float()
    _mask_eos(selected, chosen, [len(completions[row]) for row in rows], eos_ids)
    _add_bias(selected, chosen)
    selected = _penalise(selected, chosen, [prompts[row] for row in rows], [completions[row] for row in rows])
    adjusted = logits.float().clone()
    adjusted.index_copy_(0, index, selected)
    return adjusted


def _mask_eos(
    logits: torch.Tensor, params: list[SamplingParams], generated: list[int], eos_ids: Collection[int]
) -> None:
    short = [row for row, (row_params, count) in enumerate(zip(params, generated, strict=True))
             if count < row_params.min_tokens]  # fmt: skip
    if not short or not eos_ids:
        return
    rows = torch.tensor(short, device=logits.device)[:, None]
    columns = torch.tensor(sorted(eos_ids), device=logits.device)[None, :]
    logits[rows, columns] = -math.inf


def _add_bias(logits: torch.Tensor, params: list[SamplingParams]) -> None:
    entries = [
        (row, token, bias) for row, row_params in enumerate(params) for token, bias in row_params.logit_bias
    ]
    if not entries:
        return
    rows, tokens, biases = zip(*entries, strict=True)
    device = logits.device
    logits.index_put_(
        (torch.tensor(rows, device=device), torch.tensor(tokens, device=device)),
        torch.tensor(biases, dtype=logits.dtype, device=device),
        accumulate=True,
    )


def _penalise(
    logits: torch.Tensor,
    params: list[SamplingParams],
    prompts: list[Sequence[int]],
    completions: list[Sequence[int]],
) -> torch.Tensor:
    def column(values: list[float]) -> torch.Tensor:
        return torch.tensor(values, dtype=logits.dtype, device=logits.device)[:, None]

    counts = token_counts(completions, logits.shape[1], logits.device)
    repetition = column([p.repetition_penalty for p in params])
    if bool((repetition != 1.0).any()):
        seen = (token_counts(prompts, logits.shape[1], logits.device) > 0) | (counts > 0)
        penalised = torch.where(logits > 0, logits / repetition, logits * repetition)
        logits = torch.where(seen, penalised, logits)
    frequency = column([p.frequency_penalty for p in params])
    presence = column([p.presence_penalty for p in params])
    return logits - frequency * counts - presence * (counts > 0).to(logits.dtype)


def token_counts(token_lists: Sequence[Sequence[int]], vocab: int, device: torch.device) -> torch.Tensor:
    """Occurrences of each token per row, [rows, vocab] fp32, in one scatter over padded rows."""
    width = max((len(tokens) for tokens in token_lists), default=0)
    padded = torch.full((len(token_lists), width), vocab, dtype=torch.long)
    for row, tokens in enumerate(token_lists):
        padded[row, : len(tokens)] = torch.as_tensor(tokens, dtype=torch.long)
    counts = torch.zeros((len(token_lists), vocab + 1), dtype=torch.float32)  # last column: padding
    counts.scatter_add_(1, padded, torch.ones_like(padded, dtype=torch.float32))
    return counts[:, :vocab].to(device)
