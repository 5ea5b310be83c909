"""Optional hand-written fast paths behind ``agent.module.kernels: auto | off`` (docs/architecture.md).

Each kernel computes the same function as a piece of the readable code (same values and draws, gradients up to the
order of float additions); ``off`` runs the readable code alone, which ``tests/contract/test_fast_equals_plain.py``
compares ``auto`` against. The readable modules import nothing from here: :func:`install` plugs the kernels in, and
importing this package fills :class:`reverie.models.distributions.FastPaths`. Each kernel's module docstring says
what it replaces and how it is tested.
"""

from __future__ import annotations

from torch import nn

from reverie.models import distributions
from reverie.models.kernels.sampling import count_below
from reverie.models.kernels.straight_through import StraightThrough
from reverie.models.kernels.two_hot import SparseTargetLogProb
from reverie.models.switch import KERNELS, resolve

__all__ = ["KERNELS", "install", "resolve"]

distributions.FastPaths.two_hot_log_prob = SparseTargetLogProb.apply
distributions.FastPaths.count_below = count_below
distributions.FastPaths.straight_through = StraightThrough.apply


def install(module: nn.Module, kernels: str | bool) -> bool:
    """Put the kernels into ``module`` and its submodules in place; returns ``resolve(kernels)``. Submodules built
    with ``kernels="off"`` stay readable; parameters and ``state_dict`` keys do not change. Call before moving the
    modules to their device (the fused scan's check then runs on CPU in float32). ValueError: an unknown
    ``kernels``, or an RSSM the fused observe scan cannot reproduce (:func:`.rssm.check_fused_scan`).
    """
    if not resolve(kernels):
        return False
    from reverie.models.dynamics.block import BlockRSSM
    from reverie.models.dynamics.categorical import CategoricalRSSM
    from reverie.models.kernels.block_scan import BlockScan, scan_applies
    from reverie.models.kernels.onehot_linear import take_split_features
    from reverie.models.kernels.rssm import RSSMKernels

    modules = [m for m in module.modules() if getattr(m, "kernels_allowed", True)]  # not those built "off"
    if any(isinstance(m, CategoricalRSSM) for m in modules):  # its features come split: every linear takes them
        take_split_features(module)  # nn.Linear -> FeatLinear: dense inputs as before, split ones by row gathers
    for m in modules:
        if isinstance(m, BlockRSSM) and scan_applies(m):  # other depths than the official ones run the loop
            m.observe_kernel = BlockScan(m)  # checks that its scan computes what the loop does
        if isinstance(m, CategoricalRSSM):
            m.kernels = RSSMKernels(m)  # checks that its fused scan computes what the readable step does
        if hasattr(m, "fast"):
            m.fast = True
    return True
