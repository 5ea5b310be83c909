"""The kernels switch ``agent.module.kernels: auto | off``, readable without importing the kernels: a module built
with ``"off"`` stays readable whatever :func:`reverie.models.kernels.install` does later."""

from __future__ import annotations

KERNELS = ("auto", "off")


def resolve(kernels: str | bool) -> bool:
    """``"auto"`` -> True, ``"off"`` -> False, a bool passes through; ValueError otherwise."""
    if isinstance(kernels, bool):
        return kernels
    if kernels not in KERNELS:
        raise ValueError(f"kernels must be 'auto' (hand-written fast paths where they apply) or 'off' (plain autograd "
                         f"over the readable modules), got {kernels!r}; set agent.module.kernels=auto or off")
    return kernels == "auto"
