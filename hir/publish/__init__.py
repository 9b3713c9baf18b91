"""`hir publish` / `hir refresh`: validated embeddings -> Feast + Milvus, switched atomically."""

import warnings

# importing feast's online stores defines MilvusOnlineStoreConfig, whose field shadows a parent's
# attribute (a pydantic UserWarning, harmless: ../shared/STACK.md section 5)
warnings.filterwarnings("ignore", message=r'Field name "vector_enabled" in "MilvusOnlineStoreConfig"', category=UserWarning)
