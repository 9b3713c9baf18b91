"""`hir evaluate` and `hir gather`: ranking and retrieval lift of the HIR embeddings against
baselines, representation diagnostics, and the report (installed as ``hir_evaluation``).

- ``stage`` (`hir evaluate`), ``gather`` (`hir gather`): the entry points.
- ``snapshot`` (the graph/ reader), ``tasks`` (each dataset's ranking and retrieval task,
  conf/eval/task/), ``metrics`` (pure metric functions): shared by everything below.
- ``sources/``: what the HIR and content arms read (Feast/Milvus or the export files; content vectors).
- ``ranking/``: baseline features, the DLRM ranker, the ranking arms (``eval.ranking``), the lift.
- ``retrieval/``: held-out sets, the two protocols, the retrieval arms (``eval.retrieval``).
- ``report/``: metrics.json's arms, markdown/HTML/terminal rendering, figures, diagnostics.

An arm is one file (``ranking/arms/<name>.py`` or ``retrieval/arms/<name>.py``) plus one line of
conf/eval/default.yaml; the report, `hir gather` and the benchmarks read the arms from metrics.json.
"""
