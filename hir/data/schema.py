"""Names and dtypes of the graph snapshot (docs/contracts.md is the prose version)."""

from __future__ import annotations

import polars as pl

SNAPSHOT_VERSION = 1

ENTITY_TYPES = ("user", "product", "advertiser", "campaign", "category")
SPLITS = ("train", "val", "test")
TS = pl.Datetime("us", "UTC")

# canonical event columns an adapter hands to the builder (keys still in the dataset's key space)
RAW_EVENT_SCHEMA: dict[str, pl.DataType] = {
    "user_key": pl.String(),
    "entity_key": pl.String(),
    "entity_type": pl.String(),
    "stage": pl.String(),
    "timestamp": TS,
    "quantity": pl.Float64(),
    "value": pl.Float64(),
    "session": pl.String(),
}
# columns of graph/events.parquet
EVENT_COLUMNS = (
    "user_id", "entity_id", "entity_type", "stage", "stage_rank", "timestamp", "split",
    "quantity", "value", "session",
)
# metadata relations: name -> (src type, dst type)
METADATA_RELATIONS: dict[str, tuple[str, str]] = {
    "product__in_category__category": ("product", "category"),
    "product__by_advertiser__advertiser": ("product", "advertiser"),
    "category__child_of__category": ("category", "category"),
    "campaign__promotes__product": ("campaign", "product"),
    "campaign__by_advertiser__advertiser": ("campaign", "advertiser"),
}


def engage_relation(entity_type: str) -> str:
    """Name of the engagement relation from users to ``entity_type``."""
    return f"user__engages__{entity_type}"


def relation_types(relation: str) -> tuple[str, str]:
    """(src type, dst type) of a relation name ``src__rel__dst``."""
    src, _, dst = relation.split("__")
    return src, dst
