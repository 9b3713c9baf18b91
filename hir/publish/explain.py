"""`hir explain`: "why this?" for a (user, entity) pair, in the published version's own words.

    hir explain 1234 1082185                                  # completejourney's live version
    hir explain 1234 1082185 --store outputs/serving/completejourney --type product --json

    from hir.publish.explain import explain
    explain("1234", "1082185", store_dir="outputs/serving/completejourney").shared

Both Bag-of-Meaning rows (``tokens_l<k>``, ``weights_l<k>`` per level k, 0 = coarsest) are read
from the Feast online store of the live version (or of a given manifest), and the tokens the two
share are computed level by level. A shared token's weight is ``w_user · w_entity``, its term in
the inner product of the two weighted bags; a level's ``overlap`` is their sum (the ranker's
``hir_shared_l<k>`` feature, evaluation/ranking/arms/hir_tokens.py). Each token is labelled from
the version's hierarchy: ``hierarchy/prototypes.parquet`` of the run that exported it (publish
records that run's ``embeddings/`` in the manifest; the hierarchy sits beside it), words that
distinguish the prototype's most probable member entities.
"""

from __future__ import annotations

import argparse
import json
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hir.errors import HirError
from hir.serving import live_manifest

# (token, weight) pairs of one level, in the stored order (descending weight)
Bag = list[tuple[int, float]]


@dataclass(frozen=True)
class SharedToken:
    """A token in both bags of one level, its readable label and both weights."""

    level: int
    token: int
    label: str | None
    user_weight: float
    entity_weight: float

    @property
    def weight(self) -> float:
        """``user_weight · entity_weight``: the token's term in the bags' inner product."""
        return self.user_weight * self.entity_weight


@dataclass
class Explanation:
    """What a (user, entity) pair shares in one published version.

    shared: every shared token, by level (coarsest first), then by weight (largest first);
    overlap: level -> the sum of the shared tokens' weights (0 when none);
    user_tokens / entity_tokens: level -> the full bag, as stored;
    notes: what could not be read (labels), never silently.
    """

    version: str
    user_id: str
    entity_type: str
    entity_id: str
    shared: list[SharedToken]
    overlap: dict[int, float]
    user_tokens: dict[int, Bag]
    entity_tokens: dict[int, Bag]
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["shared"] = [asdict(t) | {"weight": t.weight} for t in self.shared]
        return out

    def render(self) -> str:
        """A few lines a person reads: the pair, then one line per shared token."""
        lines = [f"why {self.entity_type} {self.entity_id} for user {self.user_id} (version {self.version}):"]
        for level in sorted(self.overlap):
            tokens = [t for t in self.shared if t.level == level]
            lines.append(f"  level {level}: overlap {self.overlap[level]:.4f}"
                         f"{'' if tokens else ' (no shared token)'}")
            lines += [f"    token {t.token:>5}  weight {t.weight:.4f} (user {t.user_weight:.3f} x {self.entity_type} "
                      f"{t.entity_weight:.3f})  {t.label or '(no label)'}" for t in tokens]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def shared_tokens(user: dict[int, Bag], entity: dict[int, Bag],
                  labels: dict[int, Sequence[str]] | None = None) -> tuple[list[SharedToken], dict[int, float]]:
    """The tokens two bags share per level, and each level's overlap.

    Args:
        user, entity: level -> [(token, weight), ...] (a token at most once per level).
        labels: level -> label per token id (None: unlabelled).
    Returns:
        (shared tokens by level then weight, descending; level -> Σ w_user · w_entity).
    """
    shared: list[SharedToken] = []
    overlap: dict[int, float] = {}
    for level in sorted(set(user) | set(entity)):
        mine = dict(user.get(level, []))
        theirs = dict(entity.get(level, []))
        names = (labels or {}).get(level)
        found = [SharedToken(level, tok, names[tok] if names is not None and tok < len(names) else None,
                             float(mine[tok]), float(theirs[tok]))
                 for tok in mine.keys() & theirs.keys() if mine[tok] > 0 and theirs[tok] > 0]
        found.sort(key=lambda t: (-t.weight, t.token))
        shared += found
        overlap[level] = float(sum(t.weight for t in found))
    return shared, overlap


def prototype_labels(manifest: dict[str, Any]) -> tuple[dict[int, list[str]] | None, str | None]:
    """level -> label per token id from the exporting run's ``hierarchy/prototypes.parquet``,
    or (None, why not) when that file is gone or does not match the version's vocabularies."""
    import polars as pl

    emb_dir = (manifest.get("source") or {}).get("embeddings_dir")
    if not emb_dir:
        return None, "the manifest names no source embeddings dir, so no prototype labels"
    path = Path(emb_dir).parent / "hierarchy" / "prototypes.parquet"
    if not path.exists():
        return None, f"no prototype labels: {path} (the exporting run's hierarchy) is missing"
    protos = pl.read_parquet(path, columns=["level", "proto_id", "label"]).sort("level", "proto_id")
    labels = {int(lvl): part["label"].to_list() for (lvl,), part in protos.group_by("level", maintain_order=True)}
    sizes = [len(labels.get(k, [])) for k in range(len(labels))]
    if manifest.get("levels") and list(manifest["levels"]) != sizes:
        return None, (f"no prototype labels: {path} has levels of {sizes} prototypes, the published version "
                      f"{list(manifest['levels'])}; it belongs to another export")
    return labels, None


def _open_store(manifest: dict[str, Any]) -> Any:
    with warnings.catch_warnings():  # feast's own import-time pydantic notices (STACK.md section 5)
        warnings.simplefilter("ignore", UserWarning)
        from feast import FeatureStore

    return FeatureStore(repo_path=manifest["feast"]["repo_path"])


def online_bags(store: Any, manifest: dict[str, Any], entity_type: str, key: str) -> dict[int, Bag]:
    """level -> [(token, weight)] of one entity from the Feast online store; a HirError when the
    version has no such type or no features for ``key``."""
    views = manifest["feast"]["feature_views"]
    if entity_type not in views:
        raise HirError(f"entity type {entity_type!r} is not published in version {manifest['version']!r} "
                       f"(types: {sorted(views)}); pass one of them (--type)")
    levels = int(manifest["feast"].get("levels") or len(manifest.get("levels") or []))
    if levels == 0:
        raise HirError(f"version {manifest['version']!r} publishes no Bag-of-Meaning tokens (levels = 0)")
    join_key = manifest["feast"]["entities"][entity_type]["join_key"]
    names = [f"{p}_l{k}" for k in range(levels) for p in ("tokens", "weights")]
    row = store.get_online_features(features=[f"{views[entity_type]}:{n}" for n in names],
                                    entity_rows=[{join_key: str(key)}]).to_dict()
    if all(row[n][0] is None for n in names):
        raise HirError(f"unknown {entity_type} id {key!r}: the online store of version {manifest['version']!r} has "
                       f"no features for it ({join_key} is the dataset's original id, as in "
                       f"{manifest['feast']['offline_files'].get(entity_type, 'the export')})")
    return {k: [(int(t), float(w)) for t, w in zip(row[f"tokens_l{k}"][0] or [], row[f"weights_l{k}"][0] or [])]
            for k in range(levels)}


def explain(user_id: str, entity_id: str, entity_type: str = "product", store_dir: str | Path | None = None,
            manifest: dict[str, Any] | None = None) -> Explanation:
    """The Bag-of-Meaning tokens ``user_id`` and ``entity_id`` share in the live version of
    ``store_dir`` (or in ``manifest``'s version), read from the Feast online store.

    Raises:
        HirError: nothing published there, an unknown id, or an unpublished entity type.
    """
    if manifest is None:
        if store_dir is None:
            raise HirError("explain needs a serving store dir (publish.store_dir, e.g. outputs/serving/completejourney) "
                           "or a publish manifest")
        if not Path(store_dir).exists():
            raise HirError(f"no serving store at {store_dir}: nothing was published there; run `hir publish` (or "
                           "`make run`) first, or pass the store dir `hir publish` wrote (publish.store_dir)")
        manifest = live_manifest(Path(store_dir))
    if manifest.get("status") == "retired":
        raise HirError(f"version {manifest['version']!r} is retired (live: {manifest.get('live_version')!r}); explain "
                       "the live version (pass its store dir) or a kept one")
    store = _open_store(manifest)
    user = online_bags(store, manifest, "user", user_id)
    entity = online_bags(store, manifest, entity_type, entity_id)
    labels, why = prototype_labels(manifest)
    shared, overlap = shared_tokens(user, entity, labels)
    return Explanation(str(manifest["version"]), str(user_id), entity_type, str(entity_id), shared, overlap, user,
                       entity, [why] if why else [])


def main(argv: list[str]) -> None:
    """`hir explain USER ENTITY [--type T] [--store DIR | --data NAME] [--json]`; a user error exits 2."""
    import sys

    from hir.stages import ROOT

    ap = argparse.ArgumentParser(prog="hir explain", description=__doc__.split("\n\n")[0])
    ap.add_argument("user", help="the user's original id (e.g. a completejourney household key)")
    ap.add_argument("entity", help="the entity's original id (e.g. a completejourney product id)")
    ap.add_argument("--type", default="product", help="the entity's type (default: product)")
    ap.add_argument("--data", default="completejourney", help="dataset whose store to read: outputs/serving/<data>")
    ap.add_argument("--store", default=None, help="the serving store dir (publish.store_dir); overrides --data")
    ap.add_argument("--json", action="store_true", help="print the explanation as JSON")
    args = ap.parse_args(argv)
    store = Path(args.store) if args.store else ROOT / "outputs" / "serving" / args.data
    try:
        result = explain(args.user, args.entity, args.type, store_dir=store)
    except HirError as err:
        print(f"hir explain: {err}", file=sys.stderr)
        sys.exit(2)
    print(json.dumps(result.to_dict(), indent=2) if args.json else result.render())
