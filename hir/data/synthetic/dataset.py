"""The synthetic marketplace's files on disk: ``generate`` writes a spec's dataset, ``ensure``
caches it by the spec's hash.

Events are generated and written chunk by chunk (row groups of one Parquet file), so memory stays
flat at any size; the chunk size is fixed, so the output never depends on the machine.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from hir.data.synthetic.events import EVENTS_SCHEMA, dirty_table, events_chunk, to_table
from hir.data.synthetic.spec import GENERATOR_VERSION, STAGES, SyntheticSpec
from hir.data.synthetic.tables import entity_tables
from hir.data.synthetic.world import build_world
from hir.progress import track

log = logging.getLogger(__name__)

# events per chunk (one row group); fixed so the output does not depend on the machine
CHUNK_EVENTS = 1 << 20


def generate(spec: SyntheticSpec, out_dir: Path | str) -> dict[str, Any]:
    """Write the dataset to ``out_dir`` (created) and return its manifest.

    Files: ``events.parquet`` (user_id i64, entity_type, entity_id i64, stage, timestamp
    Datetime(us, UTC), quantity f64, value f64), ``users``/``products``/``advertisers``/
    ``campaigns``/``categories``/``promotions.parquet`` (entity metadata, Int64 keys),
    ``truth.parquet`` (entity_type, key as text, coarse, fine, weight, late),
    ``user_interests.parquet`` (key as text, coarse, fine, weight: each user's full mixture),
    ``interests.parquet`` (fine -> coarse, with names) and ``manifest.json``.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    world = build_world(spec)
    for name, table in entity_tables(spec, world).items():
        table.write_parquet(out / f"{name}.parquet")
    t_world = time.perf_counter() - t0

    t0 = time.perf_counter()
    sizes = [CHUNK_EVENTS] * (spec.n_events // CHUNK_EVENTS)
    if spec.n_events % CHUNK_EVENTS:
        sizes.append(spec.n_events % CHUNK_EVENTS)
    dirty: dict[str, int] = {}
    stage_counts = np.zeros(len(STAGES), np.int64)
    # one writer thread: numpy (generation) and Arrow (encoding) both release the GIL, so the
    # next chunk is drawn while the last one is written
    with pq.ParquetWriter(out / "events.parquet", EVENTS_SCHEMA, compression="lz4", store_schema=False) as writer, \
            ThreadPoolExecutor(max_workers=1) as pool:
        pending = None
        for i, n in enumerate(track(sizes, "synthetic events (chunks)")):
            cols = events_chunk(spec, world, i, n)
            stage_counts += np.bincount(cols["stage"], minlength=len(STAGES))
            table = to_table(cols)
            if pending is not None:
                pending.result()
            pending = pool.submit(writer.write_table, table, row_group_size=n)
            if i == 0 and spec.dirty_rows:
                bad, dirty = dirty_table(spec, world, cols)
        if pending is not None:
            pending.result()
        if spec.dirty_rows:
            writer.write_table(bad)
    t_events = time.perf_counter() - t0
    manifest = {
        "generator_version": GENERATOR_VERSION,
        "spec": asdict(spec),
        "events": spec.n_events,
        "dirty_rows": dirty,
        "stages": {s: int(c) for s, c in zip(STAGES, stage_counts)},
        "entities": world.counts(),
        "late": world.late_counts(),
        "period": {"start": world.start, "end": world.end},
        "seconds": {"world": round(t_world, 3), "events": round(t_events, 3)},
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return manifest


def ensure(spec: SyntheticSpec, cache_root: Path | str) -> Path:
    """The dataset of ``spec`` under ``cache_root/<spec hash>/``, generated once.

    Generation writes a temporary sibling directory and renames it into place, so a crashed or
    concurrent run never leaves a half-written dataset that looks complete.
    """
    final = Path(cache_root) / spec.cache_key()
    if (final / "manifest.json").exists():
        log.info("synthetic data: reusing %s", final)
        return final
    tmp = final.with_name(f"{final.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    t0 = time.perf_counter()
    generate(spec, tmp)
    try:
        os.replace(tmp, final)
    except OSError:
        # another process finished the same spec first; its copy is identical
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("synthetic data: generated %d events in %.1fs at %s", spec.n_events, time.perf_counter() - t0, final)
    return final
