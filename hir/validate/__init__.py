"""`hir validate`: Great Expectations suites over the graph snapshot and the exported embeddings."""

import logging

# GE logs its plugin registration at INFO on import; keep run logs about our data
logging.getLogger("great_expectations").setLevel(logging.WARNING)
