"""Readable prototype labels from the text of each prototype's highest-weight member entities."""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence

import numpy as np
import torch

from hir.nn.hierarchy import HierarchicalTokenizer

WORD = re.compile(r"[a-z][a-z&'-]+")
# words that say nothing about an interest (English function words + catalogue filler)
STOPWORDS = frozenset(["a", "an", "and", "are", "as", "at", "be", "by", "for", "from", "has", "have", "in", "is", "it", "its", "of", "on", "or", "that", "the", "this", "to", "was", "were", "will", "with", "new", "pack", "size", "each", "oz", "lb", "ct", "pk", "count", "item", "items", "product", "products", "brand", "brands", "other", "misc", "miscellaneous", "all", "any", "assorted", "value", "select", "regular", "set", "no", "not"])


def words(text: str | None) -> list[str]:
    """Informative lowercase words of a text (stopwords and 1-letter tokens dropped)."""
    return [w for w in WORD.findall((text or "").lower()) if w not in STOPWORDS]


@torch.inference_mode()
def top_members(tokenizer: HierarchicalTokenizer, z: np.ndarray, candidates: np.ndarray, m: int,
                chunk: int = 8192) -> list[np.ndarray]:
    """Per level, the ``m`` candidate rows with the highest probability for each prototype.

    Args:
        z: (n, C) embeddings; candidates: (c,) row indices of z to consider (e.g. entities with text).
    Returns:
        per level (K_l, m') indices into z, best first (m' = min(m, c)).
    """
    m = min(m, len(candidates))
    best_p = [None] * len(tokenizer.levels)
    best_i = [None] * len(tokenizer.levels)
    for lo in range(0, len(candidates), chunk):
        rows = candidates[lo:lo + chunk]
        lps = tokenizer.log_probs(torch.from_numpy(z[rows]))
        for lvl, lp in enumerate(lps):
            p, i = lp.T, torch.from_numpy(rows)[None, :].expand(lp.shape[1], -1)  # (K, chunk)
            if best_p[lvl] is not None:
                p, i = torch.cat([best_p[lvl], p], 1), torch.cat([best_i[lvl], i], 1)
            top = p.topk(min(m, p.shape[1]), dim=1)
            best_p[lvl], best_i[lvl] = top.values, torch.gather(i, 1, top.indices)
    return [b.numpy() if b is not None else np.zeros((k, 0), np.int64) for b, k in zip(best_i, tokenizer.levels)]


def label_prototypes(members: np.ndarray, texts: Sequence[str | None], n_words: int = 3) -> list[str]:
    """(K, m) member rows -> one label per prototype: its members' most distinctive words.

    A word scores ``count among the members x log(N / document frequency)`` over all N texts, so
    words every entity shares sink; the label lists the top ``n_words`` (or, with no informative
    word, the best member's text).
    """
    docs = [set(words(t)) for t in texts]
    df = Counter(w for d in docs for w in d)
    n = max(len([d for d in docs if d]), 1)
    labels = []
    for row in members:
        counts = Counter(w for r in row for w in docs[r])
        scored = sorted(counts, key=lambda w: (-counts[w] * math.log(1 + n / df[w]), w))
        if scored:
            labels.append(" · ".join(scored[:n_words]))
        else:
            first = next((texts[r] for r in row if texts[r]), None)
            labels.append((first or "(no text)")[:60])
    return labels
