"""The user's open funnel as a Feast feature view: ``funnel/open_funnel.parquet`` (one row per
(user, entity) pair, dense ids) -> one row per user with arrays in plain order.

Served row of a user (keyed ``user_id``, the user's original key, as the user view):

==========================  ======================  ===============================================
feature                     Feast type              what (position i of every array = one pair)
==========================  ======================  ===============================================
``funnel_entity``           Array(String)           the entity's key (the product view's key)
``funnel_<col>``            Array(Int32|Float32|    the pair column ``<col>`` of
                            Bool)                   :data:`hir.funnel.source.COLUMNS` (the entity's
                                                    statistics and repurchase cycle included); a
                                                    null is NaN in a Float32 array
                                                    (``funnel_target_age_days``: never converted;
                                                    ``funnel_cycle_median``: fewer than two trips)
                                                    and 0 in an Int32 one (``funnel_n_trips``:
                                                    no trip; ``funnel_entity_recent``: no recent
                                                    conversion)
``user_events``,            Int32 or Float32        the user's scalars of the same table, the
``user_entities``,                                  repurchase ones of :mod:`hir.funnel.cycle`
``user_last_days``,                                 included (``user_trips`` 0 and the decays and
``user_trips``, ...                                 the trip rate NaN, read online as None, for a
                                                    user who never converted)
``funnel_pairs``            Int32                   the user's pairs before the cut to ``max_pairs``
``model_version``           String                  the published version
==========================  ======================  ===============================================

Arrays hold the user's first ``max_pairs`` pairs of the plain order (``pos`` 0 first, the order
:func:`hir.funnel.source.plain_order` gives). Every column of :data:`hir.funnel.source.COLUMNS`
is served, the repurchase cycles of :mod:`hir.funnel.cycle` included, so a scorer reads every pair,
entity and user input of a funnel candidate from the Feast row (the view-base affinities come from
``funnel/base.npz``; `hir recommend` itself reads ``funnel/open_funnel.parquet``, the same rows).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl

from hir.funnel import cycle

TABLE = "open_funnel"
FILE = "open_funnel.parquet"
ETYPE = "user"
# per-pair columns of hir.funnel.source.COLUMNS (entity_id is served as its key: funnel_entity)
PAIR_COLUMNS = ("deepest", "gap", "converted", "n_events", "n_deepest", "n_target", "age_days", "target_age_days",
                "entity_users", "entity_buyers", "entity_conversion", "entity_repeat", *cycle.PAIR_COLUMNS,
                *cycle.ENTITY_COLUMNS)
USER_COLUMNS = ("user_events", "user_entities", "user_last_days", *cycle.USER_COLUMNS)
FLOATS = ("age_days", "target_age_days", "user_last_days", "entity_conversion", "entity_repeat", *cycle.FLOAT_COLUMNS)
# Feast dtype names per served column (feature_repo/features.py maps them; Int8 is served as Int32)
SCHEMA: dict[str, str] = {
    "funnel_entity": "Array(String)",
    **{f"funnel_{c}": "Array(Bool)" if c == "converted" else "Array(Float32)" if c in FLOATS else "Array(Int32)"
       for c in PAIR_COLUMNS},
    **{c: "Float32" if c in FLOATS else "Int32" for c in USER_COLUMNS},
    "funnel_pairs": "Int32", "model_version": "String",
}


def names(slug: str, service: str) -> dict[str, str]:
    """Feast object names of the open funnel in version ``slug`` (live service: ``<service>_funnel``)."""
    return {"view": f"{TABLE}_{slug}", "source": f"{TABLE}_src_{slug}", "push_source": f"{TABLE}_push_{slug}",
            "join_key": f"{ETYPE}_id", "service": f"{service}_funnel_{slug}", "live_service": live_service(service)}


def live_service(service: str) -> str:
    """The unversioned FeatureService of the live version's open funnel."""
    return f"{service}_funnel"


def with_keys(source: pl.DataFrame, user_keys: pl.Series, entity_keys: pl.Series) -> pl.DataFrame:
    """``source`` (dense ``user_id``/``entity_id``) plus ``user_key``/``entity_key``, the snapshot's
    keys by node id (``Snapshot.keys``); an id outside them is an error naming the fix."""
    for name, keys, col in (("user", user_keys, "user_id"), ("entity", entity_keys, "entity_id")):
        bad = source.filter((pl.col(col) < 0) | (pl.col(col) >= len(keys)))
        if bad.height:
            raise ValueError(f"open funnel {col} {bad[col].head(3).to_list()} outside the snapshot's {len(keys)} "
                             f"{name} nodes; the funnel was built on another snapshot: re-run `hir funnel force=true`")
    return source.with_columns(pl.col("user_id").replace_strict(pl.int_range(len(user_keys), eager=True),
                                                                user_keys.cast(pl.String)).alias("user_key"),
                               pl.col("entity_id").replace_strict(pl.int_range(len(entity_keys), eager=True),
                                                                  entity_keys.cast(pl.String)).alias("entity_key"))


def user_rows(source: pl.DataFrame, max_pairs: int, version: str, created: Any) -> pl.DataFrame:
    """One row per user of ``source`` with the module's columns.

    Args:
        source: pair rows keyed ``user_key``/``entity_key`` (:func:`with_keys`) with the columns of
            :data:`hir.funnel.source.COLUMNS`, ``pos`` and ``event_timestamp``.
        max_pairs: pairs kept per user (the first by ``pos``).
        version: ``model_version`` of the rows; created: their ``created`` time.
    """
    pairs = source.with_columns(pl.len().over("user_key").cast(pl.Int32).alias("funnel_pairs")) \
        .filter(pl.col("pos") < max_pairs).sort("user_key", "pos")
    # a null is NaN in a float column and 0 in a count (module table): Feast arrays hold no nulls
    casts = {c: pl.Boolean if c == "converted" else pl.Float32 if c in FLOATS else pl.Int32
             for c in (*PAIR_COLUMNS, *USER_COLUMNS)}
    return (
        pairs.with_columns(*[pl.col(c).cast(t).fill_null(float("nan") if t == pl.Float32 else 0 if t == pl.Int32 else False)
                             for c, t in casts.items()])
        .group_by("user_key", maintain_order=True)
        .agg(pl.col("entity_key").alias("funnel_entity"), *[pl.col(c).alias(f"funnel_{c}") for c in PAIR_COLUMNS],
             *[pl.col(c).first() for c in (*USER_COLUMNS, "funnel_pairs", "event_timestamp")])
        .rename({"user_key": "user_id"})
        .with_columns(pl.lit(version).alias("model_version"), pl.lit(created).cast(pl.Datetime("us", "UTC")).alias("created"))
        .select("user_id", *SCHEMA.keys(), "event_timestamp", "created")
    )


def serving_table(funnel_dir: Path, graph_dir: Path, dst: Path, max_pairs: int | None, version: str,
                  created: Any) -> dict[str, Any]:
    """Write the per-user table of ``funnel_dir`` to ``dst`` (the version's serving copy, keys of
    ``graph_dir``); returns rows, users, pairs served, the event_timestamp range and ``max_pairs``."""
    import json

    from hir.data.snapshot import load_snapshot

    meta = json.loads((funnel_dir / "meta.json").read_text())
    cap = int(max_pairs if max_pairs is not None else meta.get("max_funnel") or 0)
    if cap <= 0:
        raise ValueError(f"open funnel pairs per user = {cap} (publish.funnel.max_pairs or {funnel_dir}/meta.json "
                         "max_funnel); give a positive number")
    snap = load_snapshot(graph_dir)
    source = pl.read_parquet(funnel_dir / FILE)
    etype = meta.get("entity_type", "product")
    rows = user_rows(with_keys(source, snap.keys(ETYPE), snap.keys(etype)), cap, version, created)
    dst.parent.mkdir(parents=True, exist_ok=True)
    import pyarrow.parquet as pq

    from hir.publish.feast_store import plain_table

    pq.write_table(plain_table(rows.to_arrow()), dst)
    ts = rows["event_timestamp"]
    return {"rows": rows.height, "pairs": int(rows["funnel_entity"].list.len().sum() or 0), "max_pairs": cap,
            "entity_type": etype, "ts_min": ts.min(), "ts_max": ts.max(), "asof": meta["asof"],
            "visible_splits": meta["visible_splits"], "target_rank": meta["target_rank"]}
