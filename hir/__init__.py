"""hir: Hierarchical Interest Representation."""

__version__ = "0.1.0"
