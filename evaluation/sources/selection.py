"""Where the evaluation's HIR and content inputs come from: the published version (Feast +
Milvus) when ``publish/manifest.json`` exists, else the export files (a fallback, logged and noted
in the report), and the enrich stage's content vectors. The arms read them through
:class:`Sources`; ``eval.require_<input>`` says whether a missing one fails the stage."""

from __future__ import annotations

import logging
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
from omegaconf import DictConfig

from hir.data.snapshot import Snapshot
from hir.errors import HirError, InputError
from hir_evaluation.sources.content import load_content
from hir_evaluation.sources.hir import HirSide, embeddings_meta, from_feast, from_files
from hir_evaluation.sources.published import load_manifest

log = logging.getLogger(__name__)
SOURCES = ("auto", "published", "files", "none")


class Sources:
    """Where the HIR and content arms read from, with the notes the report must show."""

    def __init__(self, cfg: DictConfig, snap: Snapshot, entity_type: str,
                 history_stages: tuple[str, ...] | None = None) -> None:
        """``history_stages``: the stages of a user's history (the retrieval task's; None = all),
        which the content arms average into a profile."""
        ev, paths = cfg.eval, cfg.paths
        mode = str(ev.get("hir_source", "auto"))
        if mode not in SOURCES:
            raise HirError(f"eval.hir_source={mode!r}; expected one of {list(SOURCES)}")
        self.notes: list[str] = []
        self.snap, self.entity_type = snap, entity_type
        self.history_stages = list(history_stages) if history_stages else None
        self.emb_dir = Path(paths.embeddings_dir)
        self.manifest = load_manifest(Path(paths.publish_dir)) if mode in ("auto", "published") else None
        if mode == "published" and self.manifest is None:
            raise InputError(f"eval.hir_source=published but {Path(paths.publish_dir) / 'manifest.json'} does not exist; "
                             "run `hir publish` first")
        has_files = (self.emb_dir / f"{entity_type}.parquet").exists() and (self.emb_dir / "user.parquet").exists()
        if self.manifest is not None and self.manifest.get("status") == "retired":
            raise InputError(
                f"{Path(paths.publish_dir) / 'manifest.json'} pins version {self.manifest['version']!r}, which its store "
                f"retired (live there: {self.manifest.get('live_version')!r}); publish this run again (`hir publish`), "
                "or evaluate its export files with eval.hir_source=files"
            )
        if self.manifest is not None:
            self.hir = "published"
            if self.manifest.get("status") == "kept":
                self.notes.append(f"version {self.manifest['version']!r} is kept, not live, in {self.manifest['store_dir']} "
                                  f"(live: {self.manifest.get('live_version')!r}); evaluated through its pinned views")
        elif mode in ("auto", "files") and has_files:
            self.hir = "files"
            if mode == "auto":
                note = (f"FALLBACK: no published version at {paths.publish_dir}; HIR features read from the export "
                        f"files {self.emb_dir} (point-in-time join in polars, exact search instead of Milvus)")
                log.warning(note)
                self.notes.append(note)
        else:
            self.hir = "none"
            if bool(ev.get("require_hir", True)) and mode != "none":
                raise InputError(
                    f"no HIR embeddings: neither {Path(paths.publish_dir) / 'manifest.json'} nor "
                    f"{self.emb_dir}/{{user,{entity_type}}}.parquet exist; run `hir pipeline` (or export + publish), "
                    "or set eval.require_hir=false to evaluate the baselines alone"
                )
            self.notes.append("no HIR embeddings: the hir arms are empty (eval.require_hir=false)")
        self.content_dir = Path(paths.content_dir)
        path = self.content_dir / f"{entity_type}.parquet"
        self.content = path.exists()
        if self.content and not pl.read_parquet(path, columns=["has_text"])["has_text"].any():
            # a dataset without any text (gowalla's check-ins): nothing a content arm could use,
            # and nothing to fix, so the arms are not run rather than failed
            self.content = False
            self.notes.append(f"no {entity_type} of this dataset has text ({path}): the content arms are not run")
        elif not self.content:
            if bool(ev.get("require_content", True)):
                raise InputError(
                    f"{self.content_dir / f'{entity_type}.parquet'} is missing: no content vectors; run `hir enrich` "
                    "first, or set eval.require_content=false to skip the content arms"
                )
            self.notes.append(f"no content vectors in {self.content_dir}: the content arms are empty")

    @cached_property
    def as_of(self) -> datetime | None:
        """The time the HIR embeddings are valid from (latest user ``event_timestamp``): the
        cutoff of the engagement the export saw. None without embeddings."""
        if self.hir == "published":
            path = Path(self.manifest["feast"].get("offline_files", {}).get("user", self.emb_dir / "user.parquet"))
        elif self.hir == "files":
            path = self.emb_dir / "user.parquet"
        else:
            return None
        if not path.exists():
            return None
        return pl.read_parquet(path, columns=["event_timestamp"])["event_timestamp"].max()

    def history_splits(self, configured: Any) -> list[str]:
        """Periods the retrieval arms learn from: as configured, else the ones the export saw
        (train only when it is valid from before the val period ends), so no arm knows more."""
        if configured:
            return list(configured)
        as_of = self.as_of
        if as_of is not None and as_of < self.snap.test_start:
            self.notes.append(f"the HIR export is valid from {as_of.isoformat()}, before the test period, so the "
                              "retrieval baselines, like the HIR embeddings, learn from the train period only")
            return ["train"]
        return ["train", "val"]

    @property
    def model_version(self) -> str | None:
        if self.manifest is not None:
            return str(self.manifest["version"])
        return embeddings_meta(self.emb_dir).get("model_version")

    def record(self) -> dict[str, Any]:
        """metrics.json's ``sources``: where the HIR arms read from, whether that was the file
        fallback, the content vectors, the embeddings' cutoff and the notes for the report."""
        return {
            "ranking_hir": {"published": "feast", "files": "files", "none": None}[self.hir],
            "retrieval_hir": {"published": "milvus", "files": "files", "none": None}[self.hir],
            "fallback": self.hir == "files",
            "content": str(self.content_dir) if self.content else None,
            "embeddings_as_of": self.as_of.isoformat() if self.as_of else None,
            "notes": self.notes,
        }

    def available(self, need: str) -> bool:
        """Whether the input an arm needs (``hir`` or ``content``) exists for this run."""
        if need not in ("hir", "content"):
            raise HirError(f"unknown evaluation input {need!r}; expected 'hir' or 'content'")
        return self.hir != "none" if need == "hir" else self.content

    def hir_features(self, rows: pl.DataFrame) -> tuple[HirSide, HirSide]:
        """(user, entity) HIR features of ranking ``rows``, point-in-time, from Feast or the files."""
        if self.hir == "published":
            user, entity = from_feast(self.manifest, self.snap, rows, self.entity_type)
        else:
            user, entity = from_files(self.emb_dir, self.snap, rows, self.entity_type)
        if not user.present.any() and not entity.present.any():
            note = ("HIR features are empty for every ranking row: the embeddings' event_timestamp is later "
                    "than every candidate time, so the point-in-time join returns nothing. event_timestamp must be "
                    "the cutoff of the engagement the export saw (not the export's wall-clock time).")
            log.warning(note)
            self.notes.append(note)
        return user, entity

    def content_vectors(self) -> tuple[np.ndarray, np.ndarray] | None:
        """(entity content vectors, has-vector) for the retrieval content arm, None without content."""
        if not self.content:
            return None
        return load_content(self.content_dir, self.entity_type, self.snap.num_nodes(self.entity_type))
