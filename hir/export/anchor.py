"""Token ids that survive a retrain: the tree refitted from a previous version's tokens.

A retrain moves every vector (another seed, another week of data, another spectral rank), and an
independently refitted tree then renumbers and reshapes its tokens: on online_retail's export two
refits of the same vectors with different seeds agreed on only 0.30-0.58 of the entities' level-0
tokens after aligning prototypes (benchmarks/hierarchy.py), whatever the number of seedings, so a
ranker's token features and the report's labels changed meaning at every version.

``export.hierarchy_anchor`` points at a previous version's token table: a run's ``embeddings/``
or a published version's ``<store>/versions/<slug>/data/`` (``<type>.parquet`` with ``entity_id``
and ``tokens_l<level>``, top-1 first). Every prototype starts at the mean direction of the
entities that held it there (coarse first, within the tree's residual bound), so the start does
not depend on the new space's coordinates; then a few rounds of (members <- nearest prototype;
prototypes <- their members' mean) let it settle on the new vectors. The tokens then keep their
ids and most of their members where the data did not change, and move where it did. The export
reports the agreement with the anchor per level (``hierarchy_anchor`` in
``hierarchy/supergraph.json``), the figure a consumer of token ids watches.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import polars as pl

from hir.errors import InputError
from hir.export.fits import follow_tokens, top1_of
from hir.nn.hierarchy import HierarchicalTokenizer

log = logging.getLogger(__name__)


def read_anchor(path: str | Path, keys: dict[str, list[str]], levels: tuple[int, ...]) -> dict[str, list[np.ndarray]]:
    """The previous version's top-1 token per level of every entity of ``keys`` (type -> keys in
    node-id order): {type: per level (n_type,) int64, -1 where the anchor has no row for the key}.
    Types without a ``<type>.parquet`` in ``path`` are all -1.

    Raises:
        InputError: ``path`` holds no token table, a table lacks ``entity_id`` or a level's
            ``tokens_l<level>`` column, or a token is outside this tree's level size.
    """
    root = Path(path)
    files = {t: root / f"{t}.parquet" for t in keys}
    if not root.is_dir() or not any(f.exists() for f in files.values()):
        raise InputError(f"export.hierarchy_anchor={str(path)!r}: no token table (<type>.parquet for any of "
                         f"{sorted(keys)}) there; point it at a previous run's embeddings/ or a published "
                         "version's versions/<slug>/data/, or set export.hierarchy_anchor=null")
    out: dict[str, list[np.ndarray]] = {}
    for t, type_keys in keys.items():
        if not files[t].exists():
            out[t] = [np.full(len(type_keys), -1, np.int64) for _ in levels]
            continue
        cols = ["entity_id", *(f"tokens_l{lvl}" for lvl in range(len(levels)))]
        have = pl.read_parquet_schema(files[t])
        missing = [c for c in cols if c not in have]
        if missing:
            raise InputError(f"{files[t]}: export.hierarchy_anchor's table lacks column(s) {missing} for this "
                             f"tree's {len(levels)} levels; anchor on an export with the same "
                             "model.net.hierarchy.levels, or set export.hierarchy_anchor=null")
        prev = pl.read_parquet(files[t], columns=cols).select(
            pl.col("entity_id").cast(pl.String), *(pl.col(c).list.first().cast(pl.Int64) for c in cols[1:]))
        here = pl.DataFrame({"entity_id": pl.Series(type_keys, dtype=pl.String)})
        joined = here.join(prev.unique("entity_id", keep="first"), on="entity_id", how="left", maintain_order="left")
        per_level = []
        for lvl, k in enumerate(levels):
            tok = joined[f"tokens_l{lvl}"].fill_null(-1).to_numpy().astype(np.int64)
            if (tok >= k).any():
                bad = int(tok[tok >= k][0])
                raise InputError(f"{files[t]}: tokens_l{lvl} holds token {bad}, outside this tree's {k} level-{lvl} "
                                 "prototypes; anchor on an export with the same model.net.hierarchy.levels, or "
                                 "set export.hierarchy_anchor=null")
            per_level.append(tok)
        out[t] = per_level
    return out


def anchor_tree(tokenizer: HierarchicalTokenizer, directions: np.ndarray, anchor: list[np.ndarray],
                rounds: int = 5) -> list[np.ndarray]:
    """Refit ``tokenizer``'s tree in place from a previous version's tokens (module doc).

    Args:
        tokenizer: the tree to refit (its levels are the anchor's).
        directions: (m, dim) unit directions of the entities fitted.
        anchor: per level (m,) each entity's previous top-1 token, -1 where it had none.
        rounds: settling rounds (nearest prototype, then members' mean) after the anchored start.

    Returns:
        per level (m,) the refitted tree's top-1 tokens of ``directions``.
    """
    known = np.flatnonzero((np.stack(anchor) >= 0).all(0))
    if len(known) < tokenizer.levels[0]:
        raise InputError(f"export.hierarchy_anchor: only {len(known)} of the {len(directions)} entities fitted have "
                         f"tokens in the anchor (the tree has {tokenizer.levels[0]} level-0 prototypes); anchor on "
                         "an export of the same data, or set export.hierarchy_anchor=null")
    follow_tokens(tokenizer, directions[known], [a[known] for a in anchor])
    fitted = top1_of(tokenizer, directions)
    for _ in range(rounds):
        follow_tokens(tokenizer, directions, fitted)
        fitted = top1_of(tokenizer, directions)
    return fitted


def anchor_agreement(previous: list[np.ndarray], top1: list[np.ndarray]) -> dict[str, object]:
    """Per level, the share of the entities with an anchor token (``previous``: per level (m,),
    -1 without) whose exported top-1 token (``top1``: per level (m,), the same entities) is that
    token, and how many were compared. Ids are compared as they are: the anchored tree keeps them."""
    known = (np.stack(previous) >= 0).all(0)
    return {"compared": int(known.sum()),
            "agreement": [round(float((t[known] == p[known]).mean()), 4) if known.any() else None
                          for p, t in zip(previous, top1)]}
