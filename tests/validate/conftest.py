"""The serving fixtures (tiny prepared snapshot + contract export) are shared with tests/publish."""

from tests.publish.conftest import make_run, tiny_graph

__all__ = ["make_run", "tiny_graph"]
