"""Optional hand-written fast paths, behind one switch: ``agent.module.kernels: auto | off``.

Every kernel here replaces a piece of the readable code in ``reverie/models`` and ``reverie/agents`` with the same
function (the same values and random draws, gradients up to the order of float additions) computed with less
overhead. ``off`` runs the readable code alone: plain PyTorch autograd over the modules, the reference path that
``tests/contract/test_fast_equals_plain.py`` compares ``auto`` against (whole updates, float64, equal parameters).
``auto`` uses each kernel where it applies (most on CPU, where they were measured); nothing else changes.

=====================  ===================================================  =========================================
kernel                 replaces                                             measured gain (paired; docs/changelog.md)
=====================  ===================================================  =========================================
observe_scan.py        the categorical RSSM's step-by-step observe loop     1.056x per update at size xs, 1.035x at s
                       under autograd (one node, its backward written out)  (the scan alone: 70 -> 53 ms at xs)
block_scan.py          the block-GRU RSSM's (``agent=dreamerv3_2025``)      1.18x per update at bench/vs_jax.py's widths
                       observe loop under autograd (one node, its           in float32, 1.29x under bf16 autocast (the
                       backward written out)                                scan's forward 76 -> 38 ms; docs/speed.md)
scan_linear.py         each step's weight gradients in that loop (where     2.1% at xs, 3.3% at s (measured on CPU
                       the fused scan does not apply: GPUs)                 before the fused scan replaced it there)
onehot_linear.py       ``cat(deter, one-hot) @ W^T`` in every first layer   128 -> 58 GFLOP per xs update; 1.51x per
                       that reads the features (and imagination by index)   update in float32, 1.09x in bf16
straight_through.py    the straight-through graph of a sampled latent       one node instead of four (part of 4.7% at
                                                                            xs, with the scan's reset skip)
two_hot.py             autograd's gather from ``log_softmax`` in the        no ``(..., 255)`` temporaries (part of 13%
                       two-hot losses (reward, critic)                      at xs / 7% at s, round 2)
sampling.py            ``torch.searchsorted`` in the unimix draw            the search 0.45 -> 0.10 ms per imagination
                                                                            step at xs
=====================  ===================================================  =========================================

All of them together: docs/speed.md ("Current numbers") times whole updates with ``kernels=auto`` and ``off``.

How they plug in: the readable modules import nothing from here. :func:`install` (the agents call it once, after
building every module, before placing them on their device) swaps each ``nn.Linear`` for a :class:`.onehot_linear.
FeatLinear` (the same parameters and ``state_dict`` keys; it also takes the RSSM's split features), gives each
:class:`reverie.models.dynamics.CategoricalRSSM` its :class:`.rssm.RSSMKernels` (observe scan, scan linears,
features, imagination, straight-through, sampling), sets ``fast`` on the world models (two-hot reward loss),
:class:`reverie.models.dynamics.BlockRSSM` (sampling, straight-through) and the agents (critic or value losses, the
policy's draw) and gives each ``BlockRSSM`` of the official depths its :class:`.block_scan.BlockScan` (the observe
scan). Importing this package plugs the
distributions' kernels into :class:`reverie.models.distributions.FastPaths`. Each kernel's module docstring says
what it replaces and how it is tested against the readable code.
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
    """Put the kernels into ``module`` and every module under it, in place, after construction (the one install
    step; the module docstring lists what goes where). ``kernels="off"`` changes nothing: the readable modules as
    built. A submodule built with its own ``kernels="off"`` (``CategoricalRSSM``, ``BlockRSSM``, the world models)
    stays readable; the agent's ``"off"`` keeps every one readable. Parameters, buffers and ``state_dict`` keys do
    not change.

    The agents call it before placing the modules on their device (the fused scan's check runs where the weights
    are then: on CPU, in float32, as at construction before this step existed).

    Returns:
        whether the kernels were installed (``resolve(kernels)``).

    Raises:
        ValueError: an unknown ``kernels``; an RSSM whose modules the fused observe scan cannot reproduce
            (:func:`.rssm.check_fused_scan`: set ``kernels=off`` after editing them).
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
