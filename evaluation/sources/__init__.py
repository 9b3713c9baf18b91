"""What the HIR and content arms read: the published version or the export files (hir.py,
published.py), the enrich stage's content vectors (content.py), and which of them this run has
(selection.py)."""
