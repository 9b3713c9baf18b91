"""The report of `hir evaluate` (report/: metrics.json, report.md, report.html, PNGs): the arms and
roles metrics.json names (sections.py), the markdown/HTML/terminal renderings (render.py), the
figures (plots.py) and the representation diagnostics of the export (diagnostics.py)."""
