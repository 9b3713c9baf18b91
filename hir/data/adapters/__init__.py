"""Dataset adapters: each turns one dataset into a :class:`hir.data.raw.RawDataset`."""
