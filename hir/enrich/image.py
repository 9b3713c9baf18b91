"""Image encoders: image files -> ``(n, dim)`` float32 vectors.

Two encoders share the interface of ``hir.enrich.cache.Encoder`` (``name``, ``dim``,
``encode(paths)``):

- ``PixelStatsImageEncoder``: a dependency-free, deterministic baseline (no learned weights)
  that works offline: a joint RGB colour histogram, a gradient-orientation histogram (coarse
  shape/texture), and a fixed random projection of the downsampled, standardised pixels
  (coarse layout). It separates images by colour and layout, not by meaning; use it to run the
  image path end to end, or when nothing better is installed.
- ``OpenClipImageEncoder``: a CLIP image tower from ``open_clip`` (``pip install
  open_clip_torch``), imported only when used.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hir.errors import HirError, InputError
from hir.progress import track

log = logging.getLogger(__name__)


def _open_rgb(path: str | Path) -> Any:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as img:
            return img.convert("RGB")
    except (UnidentifiedImageError, OSError) as err:
        raise InputError(
            f"image {path} cannot be decoded ({err}); replace the file, or clear its path in the "
            "attr_image/image_path column so the entity is encoded without an image"
        ) from err


def _unit(x: np.ndarray) -> np.ndarray:
    norm = float(np.linalg.norm(x))
    return x / norm if norm > 0 else x


class PixelStatsImageEncoder:
    """Baseline image features: ``[colour hist | orientation hist | pixel projection]``.

    Each image is converted to RGB and resized to ``size x size``. Blocks, each L2-normalised
    and scaled by 1/sqrt(3) so a vector has norm <= 1:

    - colour: joint histogram over ``hist_bins``^3 RGB cells, as pixel fractions;
    - orientation: ``orient_bins`` bins of unsigned gradient angle of the luminance, weighted
      by gradient magnitude (zero for a flat image);
    - layout: ``P @ z``, where z is the image's pixels standardised per image (size*size*3) and
      P a fixed Gaussian matrix ``(proj_dim, size*size*3)`` drawn from ``seed``.

    Args:
        size: side of the downsampled image.
        hist_bins: colour bins per channel.
        orient_bins: gradient-orientation bins over [0, pi).
        proj_dim: width of the random projection.
        seed: seed of the projection matrix (part of ``name``: changing it changes vectors).
    """

    def __init__(
        self, size: int = 32, hist_bins: int = 4, orient_bins: int = 8, proj_dim: int = 64, seed: int = 0
    ) -> None:
        if min(size, hist_bins, orient_bins, proj_dim) < 1:
            raise ValueError(
                f"size, hist_bins, orient_bins, proj_dim must be >= 1, got {size}, {hist_bins}, {orient_bins}, {proj_dim}"
            )
        self.size, self.hist_bins, self.orient_bins, self.proj_dim, self.seed = size, hist_bins, orient_bins, proj_dim, seed

    def __repr__(self) -> str:
        return f"PixelStatsImageEncoder(size={self.size}, dim={self.dim})"

    @property
    def name(self) -> str:
        return (
            f"pixel-stats-v1|size={self.size}|bins={self.hist_bins}|orient={self.orient_bins}"
            f"|proj={self.proj_dim}|seed={self.seed}"
        )

    @property
    def dim(self) -> int:
        return self.hist_bins**3 + self.orient_bins + self.proj_dim

    @functools.cached_property
    def _projection(self) -> np.ndarray:
        rng = np.random.default_rng(self.seed)
        n_in = self.size * self.size * 3
        # (proj_dim, n_in); 1/sqrt(n_in) keeps outputs O(1) for a standardised input
        return (rng.standard_normal((self.proj_dim, n_in)) / np.sqrt(n_in)).astype(np.float32)

    def features(self, rgb: np.ndarray) -> np.ndarray:
        """One image ``(size, size, 3)`` float in [0, 1] -> ``(dim,)`` float32."""
        assert rgb.shape == (self.size, self.size, 3), rgb.shape
        b = self.hist_bins
        cells = np.minimum((rgb * b).astype(np.int64), b - 1)  # (S, S, 3) bin per channel
        joint = (cells[..., 0] * b + cells[..., 1]) * b + cells[..., 2]
        colour = np.bincount(joint.ravel(), minlength=b**3).astype(np.float32) / joint.size

        luma = rgb @ np.array([0.299, 0.587, 0.114], dtype=np.float32)  # (S, S)
        gy, gx = np.gradient(luma)
        angle = np.mod(np.arctan2(gy, gx), np.pi)  # unsigned orientation in [0, pi)
        obin = np.minimum((angle / np.pi * self.orient_bins).astype(np.int64), self.orient_bins - 1)
        orient = np.bincount(obin.ravel(), weights=np.hypot(gx, gy).ravel(), minlength=self.orient_bins)

        flat = rgb.reshape(-1)
        z = (flat - flat.mean()) / (flat.std() + 1e-6)
        layout = self._projection @ z.astype(np.float32)  # (proj_dim,)

        blocks = [_unit(colour), _unit(orient.astype(np.float32)), _unit(layout)]
        return (np.concatenate(blocks) / np.sqrt(3.0)).astype(np.float32)

    def encode(self, items: Sequence[str | Path]) -> np.ndarray:
        """Image paths (n) -> ``(n, dim)`` float32."""
        from PIL import Image

        out = np.zeros((len(items), self.dim), dtype=np.float32)
        for i, path in enumerate(track(items, f"encode {len(items)} images", total=len(items))):
            img = _open_rgb(path).resize((self.size, self.size), Image.Resampling.BILINEAR)
            out[i] = self.features(np.asarray(img, dtype=np.float32) / 255.0)
        return out


class OpenClipImageEncoder:
    """CLIP image tower from ``open_clip``; L2-normalised image embeddings.

    Args:
        model_name: an open_clip architecture, e.g. ``ViT-B-32``.
        pretrained: an open_clip pretrained tag (``laion2b_s34b_b79k``) or a local checkpoint
            file (offline).
        device: torch device.
        batch_size: images per forward pass.
    """

    def __init__(
        self, model_name: str = "ViT-B-32", pretrained: str = "laion2b_s34b_b79k", device: str = "cpu", batch_size: int = 64
    ) -> None:
        self.model_name, self.pretrained, self.device, self.batch_size = model_name, pretrained, device, batch_size

    def __repr__(self) -> str:
        return f"OpenClipImageEncoder({self.model_name!r}, pretrained={self.pretrained!r})"

    @property
    def name(self) -> str:
        return f"open_clip:{self.model_name}:{self.pretrained}"

    @functools.cached_property
    def _model(self) -> tuple[Any, Any]:
        try:
            import open_clip
        except ImportError as err:
            raise HirError(
                "enrich.image_encoder is OpenClipImageEncoder but open_clip is not installed; "
                "run `pip install open_clip_torch`, or use the offline baseline "
                "(enrich.image_encoder._target_=hir.enrich.image.PixelStatsImageEncoder)"
            ) from err
        t0 = time.perf_counter()
        model, _, preprocess = open_clip.create_model_and_transforms(
            self.model_name, pretrained=self.pretrained, device=self.device
        )
        model.eval()
        log.info("loaded open_clip %s (%s) in %.1fs", self.model_name, self.pretrained, time.perf_counter() - t0)
        return model, preprocess

    @functools.cached_property
    def dim(self) -> int:
        model, preprocess = self._model
        width = getattr(model.visual, "output_dim", None)
        if width is None:  # towers without the attribute (some timm backbones): probe once
            import torch
            from PIL import Image

            with torch.no_grad():
                probe = preprocess(Image.new("RGB", (224, 224))).unsqueeze(0).to(self.device)
                width = model.encode_image(probe).shape[-1]
        return int(width)

    def encode(self, items: Sequence[str | Path]) -> np.ndarray:
        """Image paths (n) -> ``(n, dim)`` float32, L2-normalised."""
        model, preprocess = self._model  # first: a missing open_clip fails before torch loads
        import torch

        out = np.zeros((len(items), self.dim), dtype=np.float32)
        starts = range(0, len(items), self.batch_size)
        with torch.no_grad():
            for s in track(starts, f"encode {len(items)} images", total=len(starts)):
                batch = torch.stack([preprocess(_open_rgb(p)) for p in items[s : s + self.batch_size]])
                feats = model.encode_image(batch.to(self.device)).float()  # (B, dim)
                out[s : s + len(batch)] = torch.nn.functional.normalize(feats, dim=-1).cpu().numpy()
        return out
