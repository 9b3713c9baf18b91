"""Feast's file registry, written atomically.

Feast 0.67's ``FileRegistryStore`` rewrites ``registry.db`` in place (open "wb", write, fsync).
Every version of a store shares that one file, so a full disk or a kill during the write would
leave it empty or torn: every version, the live one included, would stop resolving, and a
reader that opens it mid-write (a ranker while `hir publish` switches versions) would fail to
parse it. This store writes a temporary file beside it and renames it over the old one: readers
and the next run see the old registry or the new one, never a mix. `hir publish` names it in
each version's feature_store.yaml (``registry.registry_store_type``).
"""

from __future__ import annotations

import os
import uuid

from feast.infra.registry.file import FileRegistryStore
from feast.protos.feast.core.Registry_pb2 import Registry as RegistryProto
from feast.utils import _utc_now

CLASS_PATH = "hir.publish.registry_store.AtomicFileRegistryStore"


class AtomicFileRegistryStore(FileRegistryStore):
    """``FileRegistryStore`` whose writes are write-temporary + fsync + rename."""

    def _write_registry(self, registry_proto: RegistryProto) -> None:
        registry_proto.version_id = str(uuid.uuid4())
        registry_proto.last_updated.FromDatetime(_utc_now())
        self._filepath.parent.mkdir(exist_ok=True)
        tmp = self._filepath.with_name(f".{self._filepath.name}.{os.getpid()}.tmp")
        try:
            with open(tmp, mode="wb", buffering=0) as f:
                f.write(registry_proto.SerializeToString())
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self._filepath)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
