"""`hir validate`: Great Expectations suites over the graph snapshot and the exported embeddings."""

import logging
import warnings

# GE logs its plugin registration (and every ephemeral data-docs temp dir) at INFO; keep run logs
# about our data
for _name in ("great_expectations", "great_expectations.data_context.types.base"):
    logging.getLogger(_name).setLevel(logging.WARNING)
# GX 1.24 still imports the modules Python 3.11 deprecated; nothing a user can act on
warnings.filterwarnings("ignore", message=r"module 'sre_(constants|parse)' is deprecated", category=DeprecationWarning)
