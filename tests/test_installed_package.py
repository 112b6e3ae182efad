"""The installed package (`pip install .`, or the wheel in .ci/test-wheel) holds every module of
the source tree: a subpackage the packaging misses (no __init__.py, a `packages` pattern that
leaves it out) imports from the checkout but not from an install.
"""
from pathlib import Path

import pytest

import fastrank

pytestmark = pytest.mark.wheel

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "src" / "fastrank"
INSTALLED = Path(fastrank.__file__).resolve().parent


@pytest.mark.skipif(INSTALLED == SOURCE.resolve(), reason="fastrank is imported from the source tree (editable or in place)")
@pytest.mark.skipif(not SOURCE.is_dir(), reason="no source tree beside the tests (an sdist without src/)")
def test_the_installed_package_holds_every_module_of_the_source_tree():
    def modules(root: Path) -> set:
        return {str(p.relative_to(root)) for p in root.rglob("*.py") if "__pycache__" not in p.parts}

    missing = modules(SOURCE) - modules(INSTALLED)
    assert not missing, f"modules of src/fastrank/ not in the installed package {INSTALLED}: {sorted(missing)}"

