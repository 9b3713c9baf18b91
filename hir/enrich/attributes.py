"""Structured-attribute encoders: an entity type's ``attr_*`` columns -> a fixed-width ``attr_vec``.

These are feature encodings, not embeddings: the model's learned projection consumes them.
Fitted once on the snapshot (deterministic: no sampling, ties broken by value), persisted as
JSON, and re-applied unchanged to entities that arrive later (``hir refresh``).

Per column, in sorted column order:

- numeric (f64, or int/bool/date cast to f64): ``t = sign(x) log1p(|x|)`` when the fitted
  values are skewed (|sample skewness| > ``skew_threshold``), else ``t = x``; then
  ``[z, band one-hot (n bands), missing]`` with ``z = clip((t - median) / robust_scale, ±clip)``,
  ``robust_scale = IQR / 1.349`` (the std of a normal with that IQR; falls back to the std, then
  1), and bands cut at the fitted quantiles ``k / n_bands`` (ties merged, so n <= n_bands).
- categorical (str): ``[one-hot over the top_n most frequent values, other, missing]``.

A missing value (null, NaN, empty string, or the column absent from a later frame) sets the
missing slot and leaves the rest zero.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import polars as pl

from hir.errors import InputError

log = logging.getLogger(__name__)

ATTR_PREFIX = "attr_"
# columns that name a file rather than describe the entity; never encoded as attributes
IMAGE_COLUMNS = ("attr_image", "image_path")
ENCODER_FORMAT = 1


@dataclass
class NumericColumn:
    """Fitted numeric encoder of one column (see the module docstring for the formula)."""

    name: str
    log: bool
    center: float
    scale: float
    edges: list[float]
    clip: float
    kind: str = "numeric"

    @property
    def dim(self) -> int:
        return 1 + len(self.edges) + 1 + 1  # z, bands, missing

    @classmethod
    def fit(cls, name: str, x: np.ndarray, n_bands: int, skew_threshold: float, clip: float) -> NumericColumn:
        v = x[np.isfinite(x)]
        if v.size == 0:
            return cls(name, log=False, center=0.0, scale=1.0, edges=[], clip=clip)
        std = float(v.std())
        skew = float(np.mean(((v - v.mean()) / std) ** 3)) if std > 0 else 0.0
        use_log = abs(skew) > skew_threshold
        t = _signed_log1p(v) if use_log else v
        q1, center, q3 = np.quantile(t, [0.25, 0.5, 0.75])
        scale = float(q3 - q1) / 1.349
        if not scale > 0:
            scale = float(t.std()) or 1.0
        cuts = np.quantile(t, np.arange(1, n_bands) / n_bands) if n_bands > 1 else np.array([])
        edges = [float(e) for e in np.unique(cuts)]
        return cls(name, log=use_log, center=float(center), scale=scale, edges=edges, clip=clip)

    def transform(self, x: np.ndarray) -> np.ndarray:
        """``x`` (n,) float64 with NaN for missing -> ``(n, dim)`` float32."""
        out = np.zeros((x.size, self.dim), dtype=np.float32)
        ok = np.isfinite(x)
        t = _signed_log1p(x[ok]) if self.log else x[ok]
        rows = np.flatnonzero(ok)
        out[rows, 0] = np.clip((t - self.center) / self.scale, -self.clip, self.clip)
        band = np.searchsorted(np.asarray(self.edges, dtype=np.float64), t, side="right")
        out[rows, 1 + band] = 1.0
        out[~ok, -1] = 1.0
        return out


@dataclass
class CategoricalColumn:
    """Fitted one-hot encoder of one string column: top values, then other, then missing."""

    name: str
    values: list[str]
    kind: str = "categorical"

    @property
    def dim(self) -> int:
        return len(self.values) + 2  # values, other, missing

    @classmethod
    def fit(cls, name: str, s: pl.Series, top_n: int) -> CategoricalColumn:
        counts = _clean_str(s).drop_nulls().value_counts(name="n")
        # most frequent first; equal counts ordered by value so the fit is deterministic
        top = counts.sort(["n", name], descending=[True, False]).head(top_n)[name].to_list()
        return cls(name, values=top)

    def transform(self, s: pl.Series) -> np.ndarray:
        """``s`` (n,) str -> ``(n, dim)`` float32."""
        clean = _clean_str(s)
        lookup = {v: i for i, v in enumerate(self.values)}
        other, missing = len(self.values), len(self.values) + 1
        coded = clean.replace_strict(lookup, default=other, return_dtype=pl.Int64)
        idx = np.where(clean.is_null().to_numpy(), missing, coded.to_numpy())
        out = np.zeros((s.len(), self.dim), dtype=np.float32)
        out[np.arange(s.len()), idx] = 1.0
        return out


@dataclass
class AttributeEncoder:
    """The fitted column encoders of one entity type; ``transform`` gives ``(n, dim)`` float32."""

    columns: list[NumericColumn | CategoricalColumn] = field(default_factory=list)

    @property
    def dim(self) -> int:
        return sum(c.dim for c in self.columns)

    def canonical(self, frame: pl.DataFrame, source: str = "frame") -> pl.DataFrame:
        """The fitted columns as the encoders read them: numeric -> f64 (null when missing),
        categorical -> stripped str (null when missing or empty); a fitted column absent from
        ``frame`` is all null. (Also what an entity's content hash covers.)"""
        out = []
        for col in self.columns:
            if col.name not in frame.columns:
                dtype = pl.Float64 if isinstance(col, NumericColumn) else pl.String
                out.append(pl.Series(col.name, [None] * frame.height, dtype=dtype))
            elif isinstance(col, NumericColumn):
                out.append(pl.Series(col.name, _as_float(frame[col.name], source)).fill_nan(None))
            else:
                out.append(_clean_str(frame[col.name]))
        return pl.DataFrame(out)  # no columns: an empty frame (polars has no 0-column height)

    def transform(self, frame: pl.DataFrame, source: str = "frame") -> np.ndarray:
        """Encode ``frame``'s attr columns -> ``(n, dim)`` float32; a fitted column missing from
        ``frame`` encodes as missing, an attr column the encoder never saw is ignored (it was
        not in the snapshot)."""
        unseen = sorted(set(attribute_columns(frame)) - {c.name for c in self.columns})
        if unseen:
            log.warning("%s: attribute columns %s were not in the snapshot's fit; ignored", source, unseen)
        values = self.canonical(frame, source)
        blocks = [np.zeros((frame.height, 0), dtype=np.float32)]
        for col in self.columns:
            if isinstance(col, NumericColumn):
                blocks.append(col.transform(values[col.name].to_numpy().astype(np.float64, copy=False)))
            else:
                blocks.append(col.transform(values[col.name]))
        return np.concatenate(blocks, axis=1)

    def to_json(self) -> dict[str, Any]:
        return {"dim": self.dim, "columns": [asdict(c) for c in self.columns]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AttributeEncoder:
        kinds = {"numeric": NumericColumn, "categorical": CategoricalColumn}
        enc = cls([kinds[c["kind"]](**c) for c in data["columns"]])
        assert enc.dim == data["dim"], (enc.dim, data["dim"])
        return enc


def attribute_columns(frame: pl.DataFrame) -> list[str]:
    """The attr_* columns that describe an entity (image-path columns excluded), sorted."""
    return sorted(c for c in frame.columns if c.startswith(ATTR_PREFIX) and c not in IMAGE_COLUMNS)


def fit_attributes(
    frame: pl.DataFrame,
    n_bands: int = 8,
    top_n: int = 32,
    skew_threshold: float = 1.0,
    clip: float = 5.0,
    source: str = "frame",
) -> AttributeEncoder:
    """Fit one encoder per ``attr_*`` column of ``frame`` (one entity type's node table).

    Args:
        frame: node rows; string columns are categorical, numeric/bool/temporal are numeric.
        n_bands: quantile bands per numeric column (at most; tied quantiles merge).
        top_n: one-hot slots per categorical column before the "other" bucket.
        skew_threshold: |skewness| above which a numeric column is log1p-compressed.
        clip: bound on the standardised value.
        source: name of the frame in error messages (its file).
    """
    if n_bands < 1 or top_n < 0:
        raise ValueError(f"n_bands must be >= 1 and top_n >= 0, got n_bands={n_bands}, top_n={top_n}")
    columns: list[NumericColumn | CategoricalColumn] = []
    for name in attribute_columns(frame):
        s = frame[name]
        if s.dtype in (pl.String, pl.Categorical, pl.Enum):
            columns.append(CategoricalColumn.fit(name, s.cast(pl.String), top_n))
        else:
            columns.append(NumericColumn.fit(name, _as_float(s, source), n_bands, skew_threshold, clip))
    return AttributeEncoder(columns)


def _signed_log1p(x: np.ndarray) -> np.ndarray:
    return np.sign(x) * np.log1p(np.abs(x))


def _clean_str(s: pl.Series) -> pl.Series:
    """Strip whitespace; empty strings count as missing."""
    v = pl.col(s.name).cast(pl.String).str.strip_chars()
    return s.to_frame().select(pl.when(v == "").then(None).otherwise(v).alias(s.name)).to_series()


def _as_float(s: pl.Series, source: str) -> np.ndarray:
    """Numeric-ish column -> float64 with NaN for missing; temporal values become days since
    1970-01-01 so dates get the same robust scaling as any number."""
    if s.dtype.is_temporal():
        s = s.cast(pl.Datetime("us")).dt.epoch("d") if s.dtype != pl.Date else s.cast(pl.Int64)
    elif s.dtype == pl.String:
        parsed = s.str.strip_chars().cast(pl.Float64, strict=False)
        bad = s.filter(parsed.is_null() & s.is_not_null() & (s.str.strip_chars() != ""))
        if bad.len():
            raise InputError(
                f"{source}: column {s.name!r} was fitted as numeric but holds non-numbers, e.g. "
                f"{bad.head(3).to_list()}; send numbers (or leave it empty for missing)"
            )
        s = parsed
    elif not (s.dtype.is_numeric() or s.dtype == pl.Boolean or s.dtype == pl.Null):
        raise InputError(
            f"{source}: attribute column {s.name!r} has type {s.dtype}; attr_* columns must be "
            "strings or numbers (docs/contracts.md)"
        )
    return s.cast(pl.Float64).to_numpy().astype(np.float64, copy=False)  # nulls -> NaN
