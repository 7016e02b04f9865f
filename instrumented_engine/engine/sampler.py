"""Turns last-position logits into token ids: greedy, temperature, top-k, top-p, per-request seed."""
from __future__ import annotations

import torch

from instrumented_engine.engine.sampling import SamplingParams


class Sampler:
    """Samples one token per row. Rows are independent: a seeded request draws from its own
    generator, so its output does not depend on what else is in the batch.

    >>> s = Sampler()
    >>> s.sample(torch.tensor([[0.0, 3.0, 1.0]]), [SamplingParams(temperature=0.0)], [None])
    [1]
    """

    def sample(self, logits: torch.Tensor, params: list[SamplingParams],
               generators: list[torch.Generator | None]) -> list[int]:
        # logits: [num_rows, vocab] float32
        picks = self.sample_isolated(logits, params, generators)
        for pick in picks:
            if isinstance(pick, Exception):
                raise pick
        return picks

    def sample_isolated(self, logits: torch.Tensor, params: list[SamplingParams],
                        generators: list[torch.Generator | None]) -> list[int | Exception]:
        """Like `sample`, but a row that fails yields its exception and the other rows are
        sampled as usual (each draws from its own generator, so a failing neighbour changes
        nothing in a seeded row's draws)."""
        if all(p.is_greedy for p in params):
            return logits.argmax(dim=-1).tolist()
        token_ids: list[int | Exception] = []
        for row, p, gen in zip(logits, params, generators):
            try:
                token_ids.append(int(row.argmax()) if p.is_greedy
                                 else self._sample_row(row, p, gen))
            except Exception as exc:  # noqa: BLE001 - one row's fault stays in that row
                token_ids.append(exc)
        return token_ids

    @staticmethod
    def _sample_row(row: torch.Tensor, p: SamplingParams, gen: torch.Generator | None) -> int:
        # row: [vocab]
        logits = row / p.effective_temperature
        if p.top_k > 0 and p.top_k < logits.numel():
            kth = torch.topk(logits, p.top_k).values[-1]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        if p.top_p < 1.0:
            sorted_probs, sorted_ids = torch.sort(probs, descending=True)
            # Keep the smallest prefix whose mass reaches top_p. The first token always stays,
            # also when top_p is below float32's smallest value (0 >= 0 would drop it).
            drop = sorted_probs.cumsum(0) - sorted_probs >= p.top_p
            drop[0] = False
            sorted_probs = sorted_probs.masked_fill(drop, 0.0)
            choice = torch.multinomial(sorted_probs, 1, generator=gen)
            return int(sorted_ids[choice])
        return int(torch.multinomial(probs, 1, generator=gen))


def make_generator(params: SamplingParams, device: torch.device) -> torch.Generator | None:
    """A private RNG for a seeded request; unseeded ones share torch's global RNG."""
    if params.seed is None or params.is_greedy:
        return None
    gen = torch.Generator(device=device)
    gen.manual_seed(params.seed)
    return gen
