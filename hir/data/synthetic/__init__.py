"""A deterministic synthetic marketplace with a planted interest hierarchy.

``spec`` (the knobs and the cache key) < ``world`` (every entity, its planted interests and when it
exists) < ``tables`` (names, text, metadata and ground truth) and ``events`` (the event stream,
chunk by chunk) < ``dataset`` (the files on disk: ``generate``, cached by ``ensure``). Same spec,
same bytes.
"""
