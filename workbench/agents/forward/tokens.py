"""`TokenBatch`: right-padded token sequences of one learner, and packing rollouts into one."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

from workbench.core.types import Rollout


@dataclass
class TokenBatch:
    """Right-padded token sequences of one learner, ready for a forward pass.

    Attributes:
        input_ids_B_T: Prompt + response ids, right padded with the learner's pad id.
        attention_mask_B_T: 1 on real tokens, 0 on padding.
        response_mask_B_T: 1 on response tokens (the EOS included), aligned with ``input_ids_B_T``.
    """

    input_ids_B_T: torch.Tensor
    attention_mask_B_T: torch.Tensor
    response_mask_B_T: torch.Tensor

    def __len__(self) -> int:
        return self.input_ids_B_T.shape[0]

    def select(self, indices: Iterable[int] | torch.Tensor) -> TokenBatch:
        """The rows ``indices``, trailing all-padding columns dropped (for micro-batching)."""
        index_B = torch.as_tensor(
            list(indices) if not torch.is_tensor(indices) else indices, dtype=torch.long
        )
        index_B = index_B.to(self.input_ids_B_T.device)
        attn_B_T = self.attention_mask_B_T[index_B]
        width = int(attn_B_T.sum(dim=-1).max()) if len(index_B) else 0
        return TokenBatch(
            input_ids_B_T=self.input_ids_B_T[index_B, :width],
            attention_mask_B_T=attn_B_T[:, :width],
            response_mask_B_T=self.response_mask_B_T[index_B, :width],
        )

    def to(self, device: torch.device | str) -> TokenBatch:
        """A copy on ``device`` (self when already there)."""
        if self.input_ids_B_T.device == torch.device(device):
            return self
        return TokenBatch(
            self.input_ids_B_T.to(device),
            self.attention_mask_B_T.to(device),
            self.response_mask_B_T.to(device),
        )


def pack(pairs: list[tuple[list[int], list[int]]], pad_id: int) -> TokenBatch:
    """Right-pads ``(prompt_ids, response_ids)`` pairs into a `TokenBatch` (on CPU)."""
    prompt_B = torch.tensor([len(p) for p, _ in pairs], dtype=torch.long)
    length_B = prompt_B + torch.tensor([len(r) for _, r in pairs], dtype=torch.long)
    width = int(length_B.max()) if pairs else 0
    position_1_T = torch.arange(width)[None, :]
    real_B_T = position_1_T < length_B[:, None]
    ids_B_T = torch.full((len(pairs), width), pad_id, dtype=torch.long)
    ids_B_T[real_B_T] = torch.tensor([t for p, r in pairs for t in (*p, *r)], dtype=torch.long)
    response_B_T = real_B_T & (position_1_T >= prompt_B[:, None])
    return TokenBatch(ids_B_T, real_B_T.long(), response_B_T.long())


def self_token_batch(rollouts: list[Rollout], pad_id: int) -> TokenBatch:
    """The author's own view of its rollouts: ``prompt_ids + response_ids``."""
    return pack([(r.prompt_ids, r.response_ids) for r in rollouts], pad_id)
