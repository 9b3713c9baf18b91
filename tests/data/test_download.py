import hashlib

import pytest

from hir.data.download import ensure_file
from hir.errors import InputError


def test_download_from_file_url_verifies_checksum(tmp_path):
    src = tmp_path / "upstream.csv"
    src.write_text("a,b\n1,2\n")
    digest = hashlib.sha256(src.read_bytes()).hexdigest()
    got = ensure_file(tmp_path / "local" / "data.csv", src.as_uri(), digest, tmp_path / "dl")
    assert got.read_text() == "a,b\n1,2\n" and got.parent == tmp_path / "dl"
    # second call reuses the download
    assert ensure_file(tmp_path / "local" / "data.csv", src.as_uri(), digest, tmp_path / "dl") == got


def test_checksum_mismatch_leaves_no_file(tmp_path):
    src = tmp_path / "upstream.csv"
    src.write_text("tampered")
    with pytest.raises(InputError, match="sha256"):
        ensure_file(tmp_path / "data.csv", src.as_uri(), "0" * 64, tmp_path / "dl")
    assert not list((tmp_path / "dl").iterdir())


def test_absent_file_without_url_is_a_clear_error(tmp_path):
    with pytest.raises(InputError, match="no download url"):
        ensure_file(tmp_path / "data.csv", None, None, tmp_path / "dl")


def test_unreachable_url(tmp_path):
    with pytest.raises(InputError, match="downloading"):
        ensure_file(tmp_path / "data.csv", (tmp_path / "missing.csv").as_uri(), None, tmp_path / "dl")
