"""Deep-funnel ranking lift: the baseline ranker's features (features.py), the DLRM every arm
trains (ranker.py), the arms that add features to it (arms/, registered in registry.py) and the
evaluation that trains and scores them all on the same rows (evaluate.py)."""
