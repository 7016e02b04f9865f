"""Turns last-position logits into token ids: greedy, temperature, top-k, top-p, per-request seed.

Batched: the step's sampled rows share one temperature divide, one softmax, one top-k and one
draw, whatever their parameters. Per row, a batch of 16 cost 62 ms with top_p (a full sort of
the 49,152-token vocabulary per row) and 13 ms without (torch.multinomial draws one sample
through an exponential of every probability); docs/reference.md, "Sampling", has the
before/after. Two choices make it cheap and leave the distribution as it was:
- top-p looks for the nucleus inside the top 256 tokens and sorts the whole row only when
  those hold less than top_p of the mass: the nucleus is the same set either way;
- a token is drawn by inverse CDF: one uniform number per row (from the request's own
  generator when it has a seed) located in the row's cumulative sum.
"""
from __future__ import annotations

import torch

from instrumented_engine.engine.grammar import Grammar, mask_logits
from instrumented_engine.engine.sampling import SamplingParams

# top-p searches the nucleus among this many most likely tokens before sorting the whole row.
NUCLEUS_CANDIDATES = 256


class Sampler:
    """Samples one token per row. Rows are independent: a seeded request draws from its own
    generator, so its output does not depend on what else is in the batch.

    >>> s = Sampler()
    >>> s.sample(torch.tensor([[0.0, 3.0, 1.0]]), [SamplingParams(temperature=0.0)], [None])
    [1]
    >>> s.sample(torch.tensor([[0.0, 9.0, -9.0]]), [SamplingParams(top_p=0.5, seed=1)], [None])
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
                        generators: list[torch.Generator | None],
                        grammars: list[tuple[int, Grammar]] | None = None,
                        ) -> list[int | Exception]:
        """Like `sample`, but a row that fails (non-finite logits) yields its exception and
        the other rows are sampled as usual: every step below is row by row, and each seeded
        row draws from its own generator, so a failing neighbour changes nothing in it.

        `grammars`: (row, grammar) of the constrained rows, masked in place before anything
        else (instrumented_engine/engine/grammar.py); None when the batch has none."""
        dead_ends = mask_logits(logits, grammars) if grammars else ()
        rows = [i for i, p in enumerate(params) if not p.is_greedy and i not in dead_ends]
        all_sampled = len(rows) == len(params)
        # Greedy rows take their argmax; sampled rows overwrite their entry below.
        picks: list[int | Exception] = [0] * len(params) if all_sampled else logits.argmax(dim=-1).tolist()
        for i in dead_ends:
            picks[i] = RuntimeError("the grammar allows no next token")
        if not rows:
            return picks
        sampled = [params[i] for i in rows]
        probs = filtered_probabilities(logits if all_sampled else logits[rows], sampled)
        uniforms = draw_uniforms([generators[i] for i in rows], probs.device)
        tokens, valid = inverse_cdf(probs, uniforms)
        for i, token, ok in zip(rows, tokens.tolist(), valid.tolist()):
            picks[i] = token if ok else RuntimeError(
                "probability tensor contains either `inf`, `nan` or element < 0")
        return picks


def filtered_probabilities(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """logits [n, vocab] -> probabilities [n, vocab] after each row's temperature, top-k and
    top-p (dropped tokens are 0; a row sums to at most 1, not renormalised)."""
    vocab = logits.shape[-1]
    temperatures = logits.new_tensor([p.effective_temperature for p in params])
    scaled = logits / temperatures[:, None]
    top_ks = [p.top_k if 0 < p.top_k < vocab else 0 for p in params]
    if any(top_ks):
        # A row keeps every token at least as likely as its k-th (ties included, as a
        # single-row topk-and-threshold does); rows without top_k keep their whole vocabulary.
        kth = torch.topk(scaled, max(top_ks), dim=-1).values
        index = torch.tensor([max(k, 1) - 1 for k in top_ks], device=logits.device)
        threshold = kth.gather(1, index[:, None])
        threshold[torch.tensor([k == 0 for k in top_ks], device=logits.device)] = float("-inf")
        scaled = scaled.masked_fill(scaled < threshold, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    nucleus_rows = [i for i, p in enumerate(params) if p.top_p < 1.0]
    if nucleus_rows:
        top_ps = probs.new_tensor([params[i].top_p for i in nucleus_rows])
        probs[nucleus_rows] = _nucleus(probs[nucleus_rows], top_ps)
    return probs


def _nucleus(probs: torch.Tensor, top_ps: torch.Tensor) -> torch.Tensor:
    """Keep each row's smallest most-likely prefix whose mass reaches its top_p; the first
    token always stays, also when top_p is below float32's smallest value."""
    candidates = min(NUCLEUS_CANDIDATES, probs.shape[-1])
    values, ids = torch.topk(probs, candidates, dim=-1)           # descending, like a sort
    out = torch.zeros_like(probs).scatter_(-1, ids, _keep_prefix(values, top_ps))
    wide = (values.sum(-1) < top_ps).nonzero().flatten()
    if wide.numel():
        # These rows' nucleus is wider than the candidates: sort them entirely.
        full_values, full_ids = torch.sort(probs[wide], dim=-1, descending=True)
        out[wide] = torch.zeros_like(full_values).scatter_(
            -1, full_ids, _keep_prefix(full_values, top_ps[wide]))
    return out


def _keep_prefix(sorted_probs: torch.Tensor, top_ps: torch.Tensor) -> torch.Tensor:
    """sorted_probs [n, m] descending -> the same with every token after the nucleus zeroed."""
    drop = sorted_probs.cumsum(-1) - sorted_probs >= top_ps[:, None]
    drop[:, 0] = False
    return sorted_probs.masked_fill(drop, 0.0)


def draw_uniforms(generators: list[torch.Generator | None], device: torch.device) -> torch.Tensor:
    """One number in [0, 1) per row: a seeded row's from its own generator, the others' from
    torch's global one in a single call."""
    shared = [i for i, gen in enumerate(generators) if gen is None]
    if len(shared) == len(generators):
        return torch.rand(len(generators), device=device)
    uniforms = torch.empty(len(generators), device=device)
    if shared:
        uniforms[shared] = torch.rand(len(shared), device=device)
    for i, gen in enumerate(generators):
        if gen is not None:
            uniforms[i] = torch.rand(1, generator=gen, device=device)[0]
    return uniforms


def inverse_cdf(probs: torch.Tensor, uniforms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """probs [n, vocab] (non-negative, any positive sum), uniforms [n] in [0, 1) -> (token
    [n], valid [n]). The token is the first whose cumulative mass exceeds u · total, so a
    token of probability 0 is never drawn: it adds no width to the cumulative sum (a float
    sum of non-negative terms never decreases), and u · total is kept below the total, which
    rounding could otherwise reach. A row whose total is not a positive finite number (NaN
    or inf in its logits) is not valid.

    >>> tokens, valid = inverse_cdf(torch.tensor([[0.0, 0.25, 0.0, 0.75]]), torch.tensor([0.3]))
    >>> tokens.tolist(), valid.tolist()
    ([3], [True])
    """
    cdf = probs.cumsum(-1)
    total = cdf[:, -1]
    valid = torch.isfinite(total) & (total > 0)
    target = torch.minimum(uniforms * total, torch.nextafter(total, torch.zeros_like(total)))[:, None]
    tokens = torch.searchsorted(cdf, target, right=True)[:, 0].clamp_(max=probs.shape[-1] - 1)
    return tokens, valid


def make_generator(params: SamplingParams, device: torch.device) -> torch.Generator | None:
    """A private RNG for a seeded request; unseeded ones share torch's global RNG."""
    if params.seed is None or params.is_greedy:
        return None
    gen = torch.Generator(device=device)
    gen.manual_seed(params.seed)
    return gen
