"""`hir evaluate` and `hir gather`: ranking and retrieval lift of the HIR embeddings against
baselines, representation diagnostics, and the report (installed as ``hir_evaluation``).

Modules are flat on purpose (the folder is mapped to a top-level package in pyproject.toml):
snapshot (graph/ reader), tasks (ranking candidates), features (point-in-time baseline
features), hir_source / content_source (HIR and content features), ranker (DLRM-style model),
metrics (pure metric functions), retrieval (+ lightgcn), diagnostics, plots, report, stage, gather.
"""
