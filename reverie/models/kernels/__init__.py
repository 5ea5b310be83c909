"""Optional hand-written fast paths, behind one switch: ``agent.module.kernels: auto | off``.

Every kernel here replaces a piece of the readable code in ``reverie/models`` and ``reverie/agents`` with the same
function (the same values and random draws, gradients up to the order of float additions) computed with less
overhead. ``off`` runs the readable code alone: plain PyTorch autograd over the modules, the reference path that
``tests/contract/test_fast_equals_plain.py`` compares ``auto`` against (whole updates, float64, equal parameters).
``auto`` uses each kernel where it applies (most on CPU, where they were measured); nothing else changes.

=====================  ======================================================  =====================================
kernel                 replaces                                                measured gain (docs/speed.md)
=====================  ======================================================  =====================================
observe_scan.py        the categorical RSSM's per-step observe loop under       5.6% of an update at xs, 3.5% at s
                       autograd (one node, backward written out)
scan_linear.py         per-step weight gradients of the scan's linear layers    one ``G^T @ X`` per weight; the per-op
                       (where the fused scan does not apply: CUDA)              observe loop only (not timed on CPU)
onehot_linear.py       ``cat(deter, one-hot) @ W^T`` in every layer reading     fewer FLOPs in every head's first
                       the features (SplitFeat; imagination by class index)     layer (see docs/speed.md)
mlp_tape.py            the discrete actor's second forward pass in the loss     4.1% at xs, 2.0% at s
straight_through.py    the straight-through graph of a sampled latent           one node instead of four
two_hot.py             the two-hot cross-entropy's dense gradient               no ``(..., 255)`` temporaries
sampling.py            ``torch.searchsorted`` in the unimix draw                ~4x faster draw on CPU at K = 32
=====================  ======================================================  =====================================

Where the switch is read: :class:`reverie.models.dynamics.CategoricalRSSM` (observe scan, scan linears, features,
imagination, straight-through, sampling), :class:`reverie.models.world_model.WorldModel` (two-hot reward loss) and
:class:`reverie.agents.DreamerV3` (critic loss, actor tape). Each kernel's module docstring says what it replaces and
how it is tested against the readable code.
"""

from __future__ import annotations

KERNELS = ("auto", "off")


def resolve(kernels: str | bool) -> bool:
    """``"auto"`` -> True (use the kernels where they apply), ``"off"`` -> False (the readable path alone); a bool
    passes through.

    Raises:
        ValueError: any other value.
    """
    if isinstance(kernels, bool):
        return kernels
    if kernels not in KERNELS:
        raise ValueError(f"kernels must be 'auto' (hand-written fast paths where they apply) or 'off' (plain autograd "
                         f"over the readable modules), got {kernels!r}; set agent.module.kernels=auto or off")
    return kernels == "auto"
