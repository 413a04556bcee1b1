"""Weighting by tokens instead of samples, under unequal local batches.

The gradient hook gives rank ``i`` the weight ``b_i / B`` (samples). A per-token loss with
sequences of different lengths wants every token of the global batch to count the same:

    L = (Σ_all ranks Σ token losses) / T,       T = Σ_j t_j  (tokens of the global batch)

Rank ``i`` returns ``ℓ_i = S_i · B / (b_i · T)`` (``S_i`` its sum of token losses), so that
after the hook's factor ``b_i / B`` its contribution is ``S_i / T`` and the sum over ranks
is ``L``. The sum runs over the ranks the plan keeps in (their process group): a rank left
out adds neither its probe's loss nor its tokens, and takes no part in the all-reduce; a
rank whose piece of a short last window is empty has weight 0 and adds no token.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from hetero_ray.errors import UserError


def token_weighted_loss(session, loss_sum: torch.Tensor, num_tokens) -> torch.Tensor:
    if not isinstance(loss_sum, torch.Tensor) or loss_sum.dim() != 0:
        raise UserError("token_weighted_loss(loss_sum, num_tokens): loss_sum must be a scalar tensor (this "
                        "rank's SUM of token losses)")
    model = session.parts.model
    if model is not None and model.micro_batching.cuts:
        # A loop with micro_batches on a model that may be cut: ranks cut into different
        # numbers of micro-batches would enter different numbers of this all-reduce, and
        # hang. Refused at the first step on every rank, whether or not this share is cut.
        raise UserError("token_weighted_loss inside hetero_ray.train.micro_batches: it runs one all-reduce per "
                        "call, which ranks with different numbers of micro-batches cannot match; use it on whole "
                        "batches (leave micro_batches out)")
    tokens = torch.as_tensor(num_tokens, dtype=torch.float64, device=session.identity.collective_device).reshape(1)
    local_tokens = float(tokens.item())
    if local_tokens < 0:
        raise UserError(f"token_weighted_loss: num_tokens must be ≥ 0, got {local_tokens:g}")
    state = model.weight_state if model is not None else None
    weight = state.weight if state is not None else 1.0
    if state is not None and not state.takes_part:
        # Left out: the ranks in count their own tokens without it (and without waiting for it).
        return loss_sum * 0.0
    if weight == 0:
        tokens.zero_()  # a short window's one sample of weight 0: its tokens are nobody's
    if state is None or not state.alone:
        dist.all_reduce(tokens, group=state.process_group if state is not None else None)
    total_tokens = float(tokens.item())
    if total_tokens <= 0 or weight == 0:
        return loss_sum * 0.0
    # ℓ_i = S_i · B / (b_i · T) = S_i / (w_i · T), with w_i = b_i / B
    return loss_sum / (weight * total_tokens)
