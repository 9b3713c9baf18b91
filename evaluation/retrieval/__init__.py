"""Retrieval lift: the held-out sets (data.py), the two protocols and dense ranking (rank.py), the
arms (arms/, registered in registry.py), the HIR search (hir_search.py) and the evaluation that
runs them all on the same users (evaluate.py)."""
