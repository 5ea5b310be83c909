"""Scripted controllers for `reverie record --policy helpers.controllers.<name>` in the tests."""

from reverie.envs.testing import cartpole_balance  # noqa: F401  (the one bench/offline_finetune.py uses too)
