"""Readable prototype labels: class-based TF-IDF over the text of every member of a token, and the
texts of its most probable members (what a person checks the label against)."""

from __future__ import annotations

import re
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


def class_tfidf_labels(tokens: np.ndarray, k: int, texts: Sequence[str | None], n_words: int = 3,
                       max_share: float = 0.5) -> list[str]:
    """One label per token: the words of its members' text by class-based TF-IDF.

    Every entity with text whose top-1 token is t is a member of class t (not only the few
    nearest the prototype, which are often odd ones). With ``tf[t, w]`` the share of t's members
    whose text carries w and ``f[w]`` the members carrying w over all classes,
    ``score = tf[t, w] * log(1 + A / f[w])`` (A = the mean number of word occurrences per class,
    as BERTopic's c-TF-IDF). A word carried by more than ``max_share`` of all entities with text
    never leads: it says nothing about one interest (e.g. a department every product names).

    Args:
        tokens: (n,) every row's top-1 token (-1 = none), rows aligned with ``texts``.
        k: tokens of the level.
    Returns:
        k labels, the top ``n_words`` joined by `` · `` (``(no text)`` for a token without
        members with text).
    """
    rows = [i for i, t in enumerate(texts) if t and 0 <= tokens[i] < k]
    docs = [sorted(set(words(texts[i]))) for i in rows]
    vocab = {w: j for j, w in enumerate(sorted({w for d in docs for w in d}))}
    if not vocab:
        return ["(no text)"] * k
    cls = np.repeat(np.asarray(tokens)[rows], [len(d) for d in docs])
    col = np.array([vocab[w] for d in docs for w in d], np.int64)
    counts = np.zeros((k, len(vocab)), np.float64)
    np.add.at(counts, (cls, col), 1.0)
    members = np.bincount(np.asarray(tokens)[rows], minlength=k).astype(np.float64)
    df = counts.sum(0)  # (V,) entities carrying the word, over all classes
    tf = counts / np.maximum(members[:, None], 1.0)
    used = (members > 0).sum()
    idf = np.log1p(df.sum() / max(used, 1) / np.maximum(df, 1.0))
    score = tf * idf[None, :]
    score[:, df > max_share * len(rows)] = 0.0
    names = np.array(sorted(vocab, key=vocab.get))
    labels = []
    for t in range(k):
        best = [j for j in np.argsort(-score[t], kind="stable")[:n_words] if score[t, j] > 0]
        labels.append(" · ".join(names[best]) if best else ("(no text)" if not members[t] else "(common words only)"))
    return labels


def member_texts(members: np.ndarray, texts: Sequence[str | None], n: int = 5, width: int = 40) -> list[list[str]]:
    """(K, m) member rows, best first -> per prototype the first ``n`` member texts (cut at ``width``)."""
    return [[texts[r][:width] for r in row if texts[r]][:n] for row in members]
