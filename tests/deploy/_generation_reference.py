"""The independent reference for sampled generation: transformers' own ``generate`` on the same random-weight
LLaMA (its KV cache, positions, padding and stopping), its own repetition penalty, temperature, top-k and top-p
processors, and, instead of ``torch.multinomial``, a last processor that draws each row's token by the inverse
CDF of the same uniform numbers ``deploy.generate`` takes from ``numpy.random.default_rng(seed)`` (one per row and
step): greedy decoding then takes exactly that token."""

from __future__ import annotations

import numpy as np


def transformers_generate(ids, mask, max_new_tokens, *, eos=None, pad=None, do_sample=False, temperature=1.0,
                          top_k=50, top_p=1.0, repetition_penalty=1.0, seed=None):
    import torch
    from transformers.generation import logits_process as lp

    from tvm_fusion_ext.models.causal_lm import causal_lm

    model, _ = causal_lm("tiny")  # seed 0: the weights the export has
    model.generation_config.eos_token_id = eos
    rng = np.random.default_rng(seed)

    class InverseCdfDraw(lp.LogitsProcessor):
        def __call__(self, input_ids, scores):
            probs = torch.softmax(scores.double(), dim=-1)
            cdf = torch.cumsum(probs, dim=-1)
            u = torch.from_numpy(rng.random(scores.shape[0]))
            picked = torch.searchsorted(cdf, u[:, None] * cdf[:, -1:], right=True)
            picked = torch.minimum(picked, torch.tensor(scores.shape[-1] - 1))
            return torch.full_like(scores, -float("inf")).scatter(1, picked, 0.0)

    processors = lp.LogitsProcessorList()
    if do_sample:  # the warpers generate() adds with sampling, in its order, then the draw
        if temperature != 1.0:
            processors.append(lp.TemperatureLogitsWarper(float(temperature)))
        if top_k != 0:
            processors.append(lp.TopKLogitsWarper(top_k=top_k))
        if top_p < 1.0:
            processors.append(lp.TopPLogitsWarper(top_p=top_p))
        processors.append(InverseCdfDraw())
    with torch.no_grad():
        out = model.generate(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                             max_new_tokens=max_new_tokens, do_sample=False, logits_processor=processors,
                             repetition_penalty=repetition_penalty, eos_token_id=eos,
                             pad_token_id=(0 if eos is None else pad if pad is not None else np.atleast_1d(eos)[0]))
    return out.numpy()
