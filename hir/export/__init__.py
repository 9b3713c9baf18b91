"""`hir export`: embeddings, Bag-of-Meaning tokens and the interest hierarchy of a trained model."""
