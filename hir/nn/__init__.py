"""Plain torch.nn building blocks of the hir model (no Lightning, no Hydra)."""

from hir.nn.attention import BiasedSelfAttention
from hir.nn.buckets import BucketVocab
from hir.nn.hierarchy import HierarchicalTokenizer
from hir.nn.losses import AlignLoss, BalanceLoss, CatalogueLoss, DistillLoss
from hir.nn.net import HirNet
from hir.nn.transformer import GraphTransformer

__all__ = [
    "AlignLoss",
    "BalanceLoss",
    "BiasedSelfAttention",
    "BucketVocab",
    "CatalogueLoss",
    "DistillLoss",
    "GraphTransformer",
    "HierarchicalTokenizer",
    "HirNet",
]
