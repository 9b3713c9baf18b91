"""GroupNorm over a batch: standardise embeddings per group (entity type x view)."""

from __future__ import annotations

import torch
from torch import Tensor, nn


class GroupedBatchNorm(nn.Module):
    """Batch normalisation (no affine) with separate statistics per group.

    ``y = (x - mean_g) / sqrt(var_g + eps)`` where g is the row's group (here: the seed's entity
    type and the view). Standardising each group removes what merely tells groups apart (a user
    from a product, the engagement view from the knowledge view), so the shared prototypes and
    the contrastive loss work on what the entities are about. Training uses the batch statistics
    of groups with at least two rows and updates running statistics (momentum ``momentum``);
    evaluation uses the running statistics.

    Args:
        n_groups: number of groups G.
        dim: feature width C.
        momentum: running-statistics update rate (default 0.1).
        eps: variance floor (default 1e-5).
    """

    def __init__(self, n_groups: int, dim: int, momentum: float = 0.1, eps: float = 1e-5) -> None:
        super().__init__()
        self.n_groups, self.dim, self.momentum, self.eps = n_groups, dim, momentum, eps
        self.register_buffer("running_mean", torch.zeros(n_groups, dim))
        self.register_buffer("running_var", torch.ones(n_groups, dim))

    def forward(self, x: Tensor, group: Tensor) -> Tensor:
        """x: (B, C), group: (B,) int64 in [0, G) -> (B, C) float32 (statistics in fp32 also under autocast)."""
        x = x.float()
        mean, var = self.running_mean[group], self.running_var[group]  # (B, C)
        if self.training:
            counts = torch.bincount(group, minlength=self.n_groups).to(x.dtype)[:, None]  # (G, 1)
            g_mean = torch.zeros(self.n_groups, self.dim, dtype=x.dtype, device=x.device).index_add(0, group, x) / counts.clamp_min(1)
            centred = x - g_mean[group]
            g_var = torch.zeros_like(g_mean).index_add(0, group, centred * centred) / counts.clamp_min(1)
            live = (counts >= 2)[group]  # (B, 1): groups with batch statistics
            mean = torch.where(live, g_mean[group], mean)
            var = torch.where(live, g_var[group], var)
            with torch.no_grad():
                upd = (counts >= 2).squeeze(1)
                unbiased = g_var * counts / (counts - 1).clamp_min(1)
                self.running_mean[upd] = (1 - self.momentum) * self.running_mean[upd] + self.momentum * g_mean[upd].detach()
                self.running_var[upd] = (1 - self.momentum) * self.running_var[upd] + self.momentum * unbiased[upd].detach()
        return (x - mean) / torch.sqrt(var + self.eps)

    def extra_repr(self) -> str:
        return f"groups={self.n_groups}, dim={self.dim}, momentum={self.momentum}"
