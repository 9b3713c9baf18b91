"""pyproject.toml lists every package, so a non-editable install carries them all."""

import tomllib

from tests.conftest import ROOT


def test_every_package_directory_is_listed():
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(setup["packages"])
    mapping = setup["package-dir"]
    found = set()
    for name, folder in mapping.items():
        base = ROOT / folder
        for init in base.rglob("__init__.py"):
            rel = init.parent.relative_to(base)
            found.add(".".join([name, *rel.parts]))
    assert found == listed, f"unlisted: {sorted(found - listed)}; stale: {sorted(listed - found)}"


def test_kernels_and_evaluation_have_unambiguous_import_names():
    mapping = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    assert mapping["hir_kernels"] == "kernels" and mapping["hir_evaluation"] == "evaluation"
    assert "kernels" not in mapping and "evaluation" not in mapping
