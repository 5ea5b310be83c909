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
scan_linear.py         each step's weight gradients in that loop (where     2.1% at xs, 3.3% at s (measured on CPU
                       the fused scan does not apply: GPUs)                 before the fused scan replaced it there)
onehot_linear.py       ``cat(deter, one-hot) @ W^T`` in every first layer   128 -> 58 GFLOP per xs update; 1.51x per
                       that reads the features (and imagination by index)   update in float32, 1.09x in bf16
mlp_tape.py            the discrete actor's second forward pass (the loss)  1.041x at xs, 1.020x at s
straight_through.py    the straight-through graph of a sampled latent       one node instead of four (part of 4.7% at
                                                                            xs, with the scan's reset skip)
two_hot.py             autograd's gather from ``log_softmax`` in the        no ``(..., 255)`` temporaries (part of 13%
                       two-hot losses (reward, critic)                      at xs / 7% at s, round 2)
sampling.py            ``torch.searchsorted`` in the unimix draw            the search 0.45 -> 0.10 ms per imagination
                                                                            step at xs
=====================  ===================================================  =========================================

All of them together: docs/speed.md ("Current numbers") times whole updates with ``kernels=auto`` and ``off``.

Where the switch is read: :class:`reverie.models.dynamics.CategoricalRSSM` (observe scan, scan linears, features,
imagination, straight-through, sampling), :class:`reverie.models.world_model.WorldModel` (two-hot reward loss) and
:class:`reverie.agents.DreamerV3` (critic loss, actor tape); for ``agent=dreamerv3_2025``,
:class:`reverie.models.dynamics.BlockRSSM` (sampling, straight-through), its world model (two-hot reward loss) and
:class:`reverie.agents.DreamerV3_2025` (value and replay value losses, the policy's draw). Each kernel's module
docstring says what it replaces and how it is tested against the readable code.
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
