"""Optional hand-written fast paths behind ``agent.module.kernels: auto | off`` (docs/architecture.md).

Each is a whole module, a subclass of a readable one computing the same function (same values and draws, gradients
up to the order of float additions): :class:`FusedRSSM` (the categorical RSSM: fused observe scan, features and
input layer read by class index), :class:`FusedBlockRSSM` (the block-GRU RSSM's fused observe scan) and
:class:`OneHotLinear` (a layer that reads those features by row gathers). :func:`install`, called once by each
agent, swaps them in; ``off`` runs the readable code alone, which ``tests/contract/test_fast_equals_plain.py``
compares ``auto`` against. The readable modules import nothing from here.
"""

from __future__ import annotations

from torch import nn

from reverie.models.dynamics.block import BlockRSSM
from reverie.models.dynamics.categorical import CategoricalRSSM
from reverie.models.kernels.block_scan import FusedBlockRSSM, scan_applies
from reverie.models.kernels.onehot_linear import OneHotLinear
from reverie.models.kernels.rssm import FusedRSSM
from reverie.models.switch import KERNELS, resolve

__all__ = ["KERNELS", "FusedBlockRSSM", "FusedRSSM", "OneHotLinear", "install", "resolve"]


def install(module: nn.Module, kernels: str | bool) -> bool:
    """Swap the fast modules into ``module`` in place; returns ``resolve(kernels)``. Every :class:`CategoricalRSSM`
    becomes a :class:`FusedRSSM` and every ``nn.Linear`` that takes its features a :class:`OneHotLinear`; every
    :class:`BlockRSSM` the fused scan reproduces a :class:`FusedBlockRSSM`. Modules under one built with
    ``kernels="off"`` stay readable; parameters and ``state_dict`` keys do not change. Call before moving the
    modules to their device (the scans' checks run on CPU). ValueError: an unknown ``kernels``, or an RSSM the fused
    scan cannot reproduce (:func:`.rssm.check_fused_scan`).
    """
    if not resolve(kernels):
        return False
    modules = _allowed(module)
    widths = set()
    for m in modules:
        if type(m) is CategoricalRSSM:
            widths.add(FusedRSSM.adopt(m).feat_dim)
        elif type(m) is BlockRSSM and scan_applies(m):  # other depths than the official ones run the loop
            FusedBlockRSSM.adopt(m)
    for m in modules:
        if type(m) is nn.Linear and m.in_features in widths:  # the layers that read the features
            m.__class__ = OneHotLinear
    return True


def _allowed(module: nn.Module) -> list[nn.Module]:
    """``module`` and its submodules, leaving out every subtree whose root was built with ``kernels="off"``."""
    if not getattr(module, "kernels_allowed", True):
        return []
    return [module] + [m for child in module.children() for m in _allowed(child)]
