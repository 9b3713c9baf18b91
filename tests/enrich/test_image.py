from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from PIL import Image

from hir.enrich.image import OpenClipImageEncoder, PixelStatsImageEncoder
from hir.errors import HirError, InputError


def _png(path, colour, stripes=False, size=(40, 30)):
    arr = np.zeros((size[1], size[0], 3), dtype=np.uint8)
    arr[:] = colour
    if stripes:
        arr[:, ::4] = (255, 255, 255)
    Image.fromarray(arr).save(path)
    return path


@pytest.fixture
def pngs(tmp_path):
    return [
        _png(tmp_path / "red.png", (220, 20, 30)),
        _png(tmp_path / "red2.png", (200, 30, 40), size=(64, 64)),
        _png(tmp_path / "blue.png", (20, 30, 220)),
        _png(tmp_path / "blue_striped.png", (20, 30, 220), stripes=True),
    ]


def test_pixel_stats_encodes_generated_pngs(pngs):
    enc = PixelStatsImageEncoder(size=16, hist_bins=4, orient_bins=8, proj_dim=32)
    x = enc.encode(pngs)
    assert x.shape == (4, enc.dim) == (4, 4**3 + 8 + 32) and x.dtype == np.float32
    assert np.isfinite(x).all() and (np.linalg.norm(x, axis=1) <= 1 + 1e-5).all()
    np.testing.assert_array_equal(x, PixelStatsImageEncoder(size=16, hist_bins=4, orient_bins=8, proj_dim=32).encode(pngs))
    cos = x @ x.T
    assert cos[0, 1] > cos[0, 2]  # red is closer to another red than to blue
    assert cos[2, 3] > cos[0, 3]  # striped blue is closer to blue than to red
    assert not np.allclose(x[2], x[3])  # stripes change the orientation/layout blocks


def test_pixel_stats_name_tracks_parameters():
    assert PixelStatsImageEncoder(seed=0).name != PixelStatsImageEncoder(seed=1).name


def test_undecodable_image_names_the_file(tmp_path):
    bad = tmp_path / "broken.png"
    bad.write_bytes(b"not an image")
    with pytest.raises(InputError, match=r"broken\.png"):
        PixelStatsImageEncoder().encode([bad])


@pytest.mark.skipif(importlib.util.find_spec("open_clip") is not None, reason="open_clip is installed")
def test_open_clip_missing_says_how_to_install(pngs):
    enc = OpenClipImageEncoder()
    assert enc.name == "open_clip:ViT-B-32:laion2b_s34b_b79k"  # no import needed for the cache id
    with pytest.raises(HirError, match="pip install open_clip_torch"):
        enc.encode(pngs)
