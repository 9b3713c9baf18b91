"""`hir publish` / `hir refresh`: validated embeddings -> Feast + Milvus, switched atomically."""
