"""Feast definitions of one published hir version.

Per entity type (user, product, advertiser, campaign, category; whichever the dataset has):

- an ``Entity`` keyed by ``<type>_id`` (the entity's original key, a string);
- a ``FileSource`` over that type's export parquet (read by the duckdb offline store), wrapped in
  a ``PushSource`` so `hir refresh` can push new entities to the online store and append them to
  that parquet (offline push: the views have only String, Array(Float32) and Array(Int32)
  fields, which Feast's offline push handles; Array(String) would not, ../shared/STACK.md §5);
- a ``FeatureView`` named ``<type>_<version>``: ``embedding`` (Array(Float32), L2-normalised),
  ``tokens_l<k>`` (Array(Int32), the top-k prototypes of level k, 0 = coarsest) and
  ``weights_l<k>`` (Array(Float32), summing to 1) per level, ``model_version``. TTL 0 = rows never
  expire: an embedding is valid until a new version replaces the whole view.

With a ``funnel`` entry in the spec (a run of `hir funnel`), also the user's open funnel: a
``FeatureView`` ``open_funnel_<version>`` keyed by ``user_id``, one row per user with arrays of the
user's first pairs in plain order (``funnel_entity`` Array(String) of entity keys, ``funnel_<col>``
per pair column; the names and dtypes are ``funnel.schema`` of the spec, see
hir/publish/funnel.py), its own sources, and its own ``FeatureService``
``<service>_funnel_<version>`` (projected as ``open_funnel``), so the rankers' service keeps
exactly its inputs.

and one ``FeatureService`` ``<service>_<version>`` for rankers over the views of the types a
ranker scores together (``service_types``, by default user + product: a row needs a join key for
every view of a service), each projected under its entity type's name, so feature columns read
``product__embedding`` whatever the version is. The other types are read by view name.

The concrete names, paths and levels come from ``publish_spec.json``, which `hir publish` writes
next to this file in the per-version working copy (<store_dir>/versions/<version>/feature_repo/).
Views are versioned rather than overwritten so a half-finished publish never touches what is
being served; `hir publish` points the unversioned service ``<service>`` at the new views last.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

from feast import Entity, FeatureService, FeatureView, Field, FileSource, PushSource, ValueType
from feast.types import Array, Bool, Float32, Int32, String

SPEC_FILE = Path(__file__).with_name("publish_spec.json")


def entity(etype: str) -> Entity:
    return Entity(name=etype, join_keys=[f"{etype}_id"], value_type=ValueType.STRING,
                  description=f"hir {etype}, keyed by its original id")


def feature_view(etype: str, table: dict[str, Any], version: str) -> FeatureView:
    batch = FileSource(
        name=table["source"], path=table["path"],
        timestamp_field="event_timestamp", created_timestamp_column="created",
    )
    push = PushSource(name=table["push_source"], batch_source=batch)
    levels = range(int(table["levels"]))
    return FeatureView(
        name=table["view"],
        entities=[entity(etype)],
        ttl=timedelta(0),
        online=True,
        source=push,
        schema=[
            Field(name=f"{etype}_id", dtype=String),
            Field(name="embedding", dtype=Array(Float32)),
            *[Field(name=f"tokens_l{k}", dtype=Array(Int32)) for k in levels],
            *[Field(name=f"weights_l{k}", dtype=Array(Float32)) for k in levels],
            Field(name="model_version", dtype=String),
        ],
        tags={"hir_version": version, "entity_type": etype},
    )


DTYPES = {"String": String, "Int32": Int32, "Float32": Float32, "Bool": Bool}


def dtype(name: str) -> Any:
    """``Array(Float32)`` / ``Int32`` (hir/publish/funnel.py's spelling) as a Feast type."""
    if name.startswith("Array(") and name.endswith(")"):
        return Array(DTYPES[name[len("Array("):-1]])
    return DTYPES[name]


def funnel_view(table: dict[str, Any], version: str) -> FeatureView:
    """The open funnel of every user (one row per user, arrays in plain order). TTL 0: a row holds
    until a refresh replaces it or a new version replaces the view."""
    batch = FileSource(
        name=table["source"], path=table["path"],
        timestamp_field="event_timestamp", created_timestamp_column="created",
    )
    push = PushSource(name=table["push_source"], batch_source=batch)
    return FeatureView(
        name=table["view"],
        entities=[entity("user")],
        ttl=timedelta(0),
        online=True,
        source=push,
        schema=[Field(name="user_id", dtype=String),
                *[Field(name=col, dtype=dtype(kind)) for col, kind in table["schema"].items()]],
        tags={"hir_version": version, "entity_type": "user", "hir_table": "open_funnel"},
    )


def ranker_service(name: str, views: dict[str, FeatureView], version: str) -> FeatureService:
    """The views, each projected under its entity type (``product__embedding``, ``user__tokens_l0``)."""
    return FeatureService(name=name, features=[v.with_name(etype) for etype, v in sorted(views.items())],
                          tags={"hir_version": version}, description="hir embeddings + tokens for rankers")


def definitions(spec: dict[str, Any]) -> list:
    """Every Feast object of one version: entities, sources, views, the versioned service(s)."""
    views = {etype: feature_view(etype, table, spec["version"]) for etype, table in spec["tables"].items()}
    objects: list = [entity(etype) for etype in views]
    for view in views.values():
        objects += [view.stream_source.batch_source, view.stream_source, view]
    served = {t: views[t] for t in spec["service_types"]}
    objects.append(ranker_service(spec["feature_service"], served, spec["version"]))
    funnel = spec.get("funnel")
    if funnel:
        view = funnel_view(funnel, spec["version"])
        if "user" not in views:
            objects.append(entity("user"))
        objects += [view.stream_source.batch_source, view.stream_source, view,
                    FeatureService(name=funnel["service"], features=[view.with_name("open_funnel")],
                                   tags={"hir_version": spec["version"]},
                                   description="hir: the user's open funnel (deep-funnel candidates)")]
    return objects


# `feast plan` (which collects module-level objects) in a working copy shows what `hir publish`
# applied. Never `feast apply` a working copy: it deletes every object the copy does not define,
# i.e. all other versions, the live one included.
if SPEC_FILE.exists():
    for _obj in definitions(json.loads(SPEC_FILE.read_text())):
        globals()[f"{type(_obj).__name__}_{_obj.name}"] = _obj
