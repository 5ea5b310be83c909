"""The values of the one kernels switch, ``agent.module.kernels: auto | off``, read by the readable modules without
importing the kernels: a module built with ``kernels="off"`` stays readable whatever installs kernels later;
``"auto"`` lets :func:`reverie.models.kernels.install` put its fast paths there (the agents call it once, after
building every module, with the agent's own setting)."""

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
