"""Exact discovery search in this process, over the vectors a published version put in Milvus.

    from hir.publish.exact import ExactSearch
    s = ExactSearch(manifest, store_dir="outputs/serving/completejourney")
    s.search(s.embeddings("user", ["1234"]), "product", k=20, exclude=[["1001", "1002"]])  # [[(id, cosine), ...]]

Why: `hir recommend`'s default store is Milvus Lite, whose search is a pure-Python engine that
loops over every row of the collection in Python before each search (87% of a search on
completejourney's 92k products; docs/serving.md "Latency of hir recommend"). The collections are
exact indexes (``FLAT``, built on Lite as a one-list ``IVF_FLAT``), so the same answer needs only
the index's own scan, which this module runs directly.

The same lists, not merely the same neighbours: Lite ranks a hit by its COSINE distance
``1 - q.v`` stored as float32, so hits closer than one float32 step near 1 (6e-8) tie, and a tie
goes to the row inserted first. A BLAS matrix product rounds ``q.v`` differently from faiss in
about 1 of 11 scores at that step (measured on completejourney), which reorders such near-ties.
So the scores are faiss's own: its one-list ``IndexIVFFlat`` over the rows normalised as Lite
normalises them, and the hits ranked by (float32 distance, insertion order) and scored
``1 - distance``, as Lite ranks and scores them. One difference is left: Lite takes the top ``k``
of each of its segments (a refresh adds one) before that ranking, this module the top ``k`` of all
rows, which can only differ where rows of two segments tie to float32 at the ``k``-th place.

Two passes, because faiss's scan (a generic build, 11 ms over completejourney's 92k x 257 on one
core) is slower than BLAS's (6.6 ms): BLAS scores every row, and faiss rescores only the rows that
can reach the top ``k``. Any float32 dot product of unit vectors of dimension ``d`` is within
``gamma_d = d u / (1 - d u)`` (u = 2^-24) of the exact one, whatever its summation order, so a
row more than ``2 m`` (``m = 2 gamma_d``, twice over for safety) below the ``k``-th BLAS score has
``k`` rows above it in faiss's scores too and is left out; the rest (about ``k`` plus the rows
within 1.2e-4 of the ``k``-th at d 257) go to faiss through an ``IDSelectorBitmap``.

The vectors are the ones the version put in Milvus, read from the files publish and refresh
wrote of exactly what they inserted (hir/publish/milvus_store.py ``checked_payload``):

- ``manifest.milvus.payload.<type>.file``: the publish's rows (near-twins already nudged);
- ``manifest.refreshes[i].milvus.<type>.file``: each `hir refresh`'s rows, upserted in order (a
  later row of an id replaces the earlier one, as Milvus's upsert does).

Each file's sha256 is checked against the manifest's record when it is loaded, so the search can
only read what Milvus was given. Refreshes committed after a searcher was opened are picked up on
the next search: every refresh commit replaces live.json (atomically), and one ``stat`` per
search notices it.

Only Feast is opened (for the user embedding), never the Milvus Lite dir: Lite lets one process
at a time open a dir, and this reader needs none of it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hir.errors import HirError
from hir.serving import LIVE_FILE, read_state


def online_embeddings(store: Any, manifest: dict[str, Any], entity_type: str, ids: list[str]) -> np.ndarray:
    """(len(ids), dim) float32 embeddings of ``ids`` from the Feast online store ``store``, read
    through ``manifest``'s own view of ``entity_type``; unknown ids raise."""
    views = manifest["feast"]["feature_views"]
    if entity_type not in views:
        raise HirError(f"entity type {entity_type!r} is not published; have {sorted(views)}")
    key = manifest["feast"]["entities"][entity_type]["join_key"]
    rows = store.get_online_features(features=[f"{views[entity_type]}:embedding"],
                                     entity_rows=[{key: i} for i in ids]).to_dict()["embedding"]
    missing = [i for i, v in zip(ids, rows, strict=True) if v is None]
    if missing:
        raise HirError(f"no {entity_type} embedding online for ids {missing[:5]} (version "
                       f"{manifest['version']!r}); unknown ids, or not yet refreshed")
    return np.asarray(rows, dtype=np.float32)


def unit_rows(x: np.ndarray) -> np.ndarray:
    """(n, d) float32 rows scaled to unit length (zero rows stay zero), in float32 as Milvus
    Lite's COSINE indexes scale both their rows and the queries."""
    x = np.asarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.where(norms == 0, 1.0, norms)


def one_list_index(vectors: np.ndarray) -> Any:
    """faiss's ``IndexIVFFlat`` with one inverted list holding every row of ``vectors`` (n, d),
    inner product: the index Milvus Lite builds for hir's ``FLAT`` (milvus_store.LITE_EXACT).
    Its one centroid is set, not trained (with one list every row lands in it anyway)."""
    import faiss

    d = vectors.shape[1]
    quantizer = faiss.IndexFlat(d, faiss.METRIC_INNER_PRODUCT)
    quantizer.add(np.zeros((1, d), np.float32))
    index = faiss.IndexIVFFlat(quantizer, d, 1, faiss.METRIC_INNER_PRODUCT)
    assert index.is_trained, "one centroid set on the quantizer makes a trained one-list IVF"
    index.add(vectors)
    index.nprobe = 1
    return index


def list_vectors(index: Any) -> np.ndarray:
    """(n, d) float32 view of the rows a :func:`one_list_index` holds (its one list's codes are
    the raw vectors, in insertion order): the BLAS pass reads them without a second copy. Valid
    while ``index`` lives and gets no rows."""
    import faiss

    inv, n = index.invlists, index.ntotal
    ids = faiss.rev_swig_ptr(inv.get_ids(0), n)
    assert inv.list_size(0) == n and np.array_equal(ids, np.arange(n)), "the one list holds rows 0..n-1 in order"
    codes = faiss.rev_swig_ptr(inv.get_codes(0), n * inv.code_size)
    return np.frombuffer(codes, dtype=np.float32).reshape(n, index.d)


def rounding_margin(d: int) -> float:
    """``m``: twice the bound ``2 gamma_d`` on two float32 evaluations of one dot product of unit
    vectors of dimension ``d`` (module doc)."""
    u = 2.0**-24
    return 2 * 2 * (d * u / (1 - d * u))


@dataclass
class Rows:
    """The rows of one entity type as Milvus holds them, in insertion order: ``ids`` (n,) object
    array, ``index`` {id: row}, ``coarse`` (n,) int64 level-0 token, ``files`` the payload files
    read (publish first, then each refresh in order), ``faiss`` the :func:`one_list_index` of
    their (n, d) unit vectors (the only copy kept: 4 n d bytes, 95 MB for 92k x 257) and
    ``vectors`` its (n, d) view (:func:`list_vectors`)."""

    ids: np.ndarray
    index: dict[str, int]
    coarse: np.ndarray
    files: list[str]
    faiss: Any
    vectors: np.ndarray

    @property
    def shape(self) -> tuple[int, int]:
        """(rows, dim) of the vectors searched."""
        return int(self.faiss.ntotal), int(self.faiss.d)

    @classmethod
    def read(cls, records: list[dict[str, Any]], entity_type: str) -> Rows:
        """The rows of the payload ``records`` ({file, sha256} each, in insertion order): for an
        id in several, its last row (Milvus's upsert)."""
        import pyarrow.parquet as pq

        from hir.validate.binding import sha256

        ids: list[str] = []
        vectors, coarse = [], []
        for rec in records:
            path = Path(rec["file"])
            if not path.exists():
                raise HirError(f"{path} is missing: the {entity_type} rows the version put in Milvus; search "
                               "through Milvus (--discovery milvus) or publish the version again")
            if rec.get("sha256") and sha256(path) != rec["sha256"]:
                raise HirError(f"{path} changed since it was inserted into Milvus (its sha256 differs from the "
                               "manifest's); search through Milvus (--discovery milvus) or publish again")
            table = pq.read_table(path, columns=["id", "coarse_token", "embedding"])
            emb = table["embedding"].combine_chunks()
            dim = emb.type.list_size
            ids += table["id"].to_pylist()
            vectors.append(emb.flatten().to_numpy(zero_copy_only=False).astype(np.float32).reshape(len(emb), dim))
            coarse.append(table["coarse_token"].to_numpy().astype(np.int64))
        index = {key: i for i, key in enumerate(ids)}  # the last row of an id wins
        keep = np.fromiter(sorted(index.values()), np.int64, len(index))
        flat = one_list_index(np.ascontiguousarray(unit_rows(np.concatenate(vectors)[keep])))  # (n, d) rows
        return cls(ids=np.asarray(ids, dtype=object)[keep], index={ids[i]: r for r, i in enumerate(keep.tolist())},
                   coarse=np.concatenate(coarse)[keep], files=[r["file"] for r in records], faiss=flat,
                   vectors=list_vectors(flat))


def payload_records(manifest: dict[str, Any], entity_type: str) -> list[dict[str, Any]]:
    """The files a version put in Milvus for ``entity_type``: the publish's, then every refresh's."""
    payload = manifest["milvus"].get("payload") or {}
    if entity_type not in payload:
        have = sorted(manifest["milvus"].get("collections", {}))
        if entity_type not in have:
            raise HirError(f"entity type {entity_type!r} has no Milvus collection in version "
                           f"{manifest['version']!r}; have {have}")
        raise HirError(f"version {manifest['version']!r} records no file of the {entity_type} rows it put in Milvus "
                       "(published before hir kept them); search through Milvus (--discovery milvus) or publish again")
    return [payload[entity_type], *(r["milvus"][entity_type] for r in manifest.get("refreshes", [])
                                    if entity_type in (r.get("milvus") or {}))]


class ExactSearch:
    """Cosine top-k over a version's Milvus rows, in process (module doc); answers as
    :class:`hir.publish.retrieval.Retriever` does (``embeddings``, ``search``), so discovery takes
    either.

    Args:
        manifest: the version's publish manifest (``milvus.payload``, ``refreshes``, ``feast``).
        store_dir: its serving store; when given, refreshes committed there later are read on the
            next search. None: the manifest's rows only.
    """

    def __init__(self, manifest: dict[str, Any], store_dir: str | Path | None = None) -> None:
        self.manifest = manifest
        self.store_dir = Path(store_dir) if store_dir is not None else None
        self._store: Any = None  # the Feast store, opened on the first embeddings() call
        self.rows: dict[str, Rows] = {}
        self._seen = self._stamp()

    def __repr__(self) -> str:
        sizes = {t: r.shape for t, r in self.rows.items()}
        return f"ExactSearch(version={self.manifest['version']!r}, loaded={sizes})"

    def _stamp(self) -> tuple[int, int] | None:
        """live.json's (inode, mtime): a refresh commit replaces the file, so either changes."""
        if self.store_dir is None:
            return None
        try:
            st = os.stat(self.store_dir / LIVE_FILE)
        except FileNotFoundError:
            return None
        return st.st_ino, st.st_mtime_ns

    def _follow_refreshes(self) -> None:
        """Re-read this version's manifest when live.json changed; reload a type whose refreshes grew."""
        stamp = self._stamp()
        if stamp == self._seen:
            return
        self._seen = stamp
        entry = next((e for e in read_state(self.store_dir)["versions"].values()
                      if e.get("manifest", {}).get("version") == self.manifest["version"]), None)
        if entry is None:  # retired since: keep serving what was loaded, as its files may be gone
            return
        self.manifest = entry["manifest"]
        for etype, rows in list(self.rows.items()):
            if [r["file"] for r in payload_records(self.manifest, etype)] != rows.files:
                self.rows[etype] = Rows.read(payload_records(self.manifest, etype), etype)

    def _rows(self, entity_type: str) -> Rows:
        if entity_type not in self.rows:
            self.rows[entity_type] = Rows.read(payload_records(self.manifest, entity_type), entity_type)
        return self.rows[entity_type]

    def embeddings(self, entity_type: str, ids: list[str]) -> np.ndarray:
        """(len(ids), dim) float32 embeddings from the Feast online store; unknown ids raise."""
        if self._store is None:
            from feast import FeatureStore

            self._store = FeatureStore(repo_path=self.manifest["feast"]["repo_path"])
        return online_embeddings(self._store, self.manifest, entity_type, ids)

    def search(self, vectors: np.ndarray, entity_type: str, k: int = 10, coarse_tokens: list[int] | None = None,
               exclude: list[list[str]] | None = None) -> list[list[tuple[str, float]]]:
        """Top-``k`` (id, cosine) of ``entity_type`` for each row of ``vectors`` (n, dim), ranked
        and scored as Milvus Lite does (module doc); ``coarse_tokens``: only rows with one of these
        level-0 tokens; ``exclude[i]``: ids row ``i`` must not get (ids not held are ignored, as
        Milvus's filter ignores them). Fewer than ``k`` where fewer rows qualify."""
        import faiss

        if self.store_dir is not None:
            self._follow_refreshes()
        rows = self._rows(entity_type)
        q = unit_rows(np.atleast_2d(vectors))
        n = len(rows.ids)
        if q.shape[1] != rows.shape[1]:
            raise HirError(f"query vectors have {q.shape[1]} dims, the {entity_type} rows {rows.shape[1]}")
        if exclude is not None and len(exclude) != len(q):
            raise HirError(f"exclude has {len(exclude)} id lists for {len(q)} query vectors; give one per row")
        if k <= 0 or n == 0:
            return [[] for _ in range(len(q))]
        allowed = np.isin(rows.coarse, np.asarray(coarse_tokens, np.int64)) if coarse_tokens else np.ones(n, bool)
        kk, cut_width = min(k, n), 2 * rounding_margin(rows.shape[1])
        screen = q @ rows.vectors.T  # (len(q), n) BLAS scores, within 2 gamma_d of faiss's
        out: list[list[tuple[str, float]]] = []
        for i in range(len(q)):
            valid = allowed.copy()
            if exclude is not None and exclude[i]:
                valid[[rows.index[key] for key in exclude[i] if key in rows.index]] = False
            s = np.where(valid, screen[i], -np.inf)
            if int(valid.sum()) > kk:  # keep the rows that can reach the top kk (module doc)
                kth = s[np.argpartition(-s, kk - 1)[kk - 1]]
                valid &= s >= kth - cut_width
            bitmap = np.packbits(valid, bitorder="little")  # kept alive through the search
            params = faiss.SearchParametersIVF(sel=faiss.IDSelectorBitmap(n, faiss.swig_ptr(bitmap)), nprobe=1)
            ip, found = rows.faiss.search(q[i:i + 1], kk, params=params)  # (1, kk) each
            hit = found[0] >= 0
            found, dist = found[0][hit], (1.0 - ip[0][hit].astype(np.float64)).astype(np.float32)
            order = np.lexsort((found, dist))  # Lite's rank: float32 distance, then the earlier row
            out.append([(rows.ids[j], 1.0 - float(dist[o])) for o, j in zip(order.tolist(), found[order].tolist(),
                                                                           strict=True)])
        return out

    def for_user(self, user_id: str, entity_type: str = "product", k: int = 10,
                 coarse_tokens: list[int] | None = None) -> list[tuple[str, float]]:
        """The user's embedding (Feast) -> its top-``k`` entities of ``entity_type``."""
        return self.search(self.embeddings("user", [user_id]), entity_type, k, coarse_tokens)[0]

    def close(self) -> None:
        """Nothing to release (no Milvus client is opened); for symmetry with the Retriever."""
