"""``prepare.spark``: where and how the Spark engine runs (no pyspark import here)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class SparkOptions:
    """Args:
    master: the Spark master URL: ``local[2]`` (tests, one machine), ``spark://host:7077``,
        ``yarn``, ``k8s://https://host:443``.
    app_name: the application name in the Spark UI.
    work_dir: where Spark reads the canonical events and writes its part files: a local path or
        any URI the cluster reads and writes (``hdfs://...``, ``s3a://...``) that the driver's
        pyarrow also reaches (it stages the canonical events there and assembles the contract
        files from the parts). null: ``graph/_tmp/spark`` (local).
    shuffle_partitions: ``spark.sql.shuffle.partitions`` (null: Spark's default, 200; local
        tests want a handful).
    conf: any other Spark settings, e.g. ``{spark.executor.memory: 8g}``.
    """

    master: str = "local[2]"
    app_name: str = "hir-prepare"
    work_dir: str | None = None
    shuffle_partitions: int | None = None
    conf: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_config(cls, cfg: Any) -> SparkOptions:
        """From a ``prepare.spark`` mapping (null or missing keys keep their defaults)."""
        if cfg is None:
            return cls()
        given = {k: cfg[k] for k in cfg if cfg[k] is not None}
        unknown = sorted(set(given) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(f"prepare.spark has unknown keys {unknown}; expected some of {sorted(cls.__dataclass_fields__)}")
        if "conf" in given:
            given["conf"] = dict(given["conf"])
        return cls(**given)
