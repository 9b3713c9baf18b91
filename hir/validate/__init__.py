"""`hir validate`: Great Expectations suites over the graph snapshot and the exported embeddings."""

import logging
import warnings

# GE logs its plugin registration at INFO on import; keep run logs about our data
logging.getLogger("great_expectations").setLevel(logging.WARNING)
# GX 1.24 still imports the modules Python 3.11 deprecated; nothing a user can act on
warnings.filterwarnings("ignore", message=r"module 'sre_(constants|parse)' is deprecated", category=DeprecationWarning)
