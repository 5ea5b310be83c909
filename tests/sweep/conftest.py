"""Shared by the tests of the PlaNet-on-Atari study's scripts (examples/planet_atari/*.py, not a package)."""

import importlib.util
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).parents[2] / "examples" / "planet_atari"


@pytest.fixture
def planet_atari_script():
    """``load(name)`` -> the module of ``examples/planet_atari/<name>.py``, loaded from its file."""
    def load(name: str):
        spec = importlib.util.spec_from_file_location(f"planet_atari_{name}", EXAMPLES / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    return load
