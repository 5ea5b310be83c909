"""Benchmarks (docs/speed.md): scripts that print numbers, run from the repository root as
``python bench/<script>.py``. A package only so the scripts can share ``bench.run``'s presets and batch."""
