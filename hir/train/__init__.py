"""`hir train`: graph snapshot + content -> a trained HirNet (Lightning)."""
