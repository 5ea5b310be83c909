"""``torch.compile`` with a clean eager fallback, for the agents' ``compile`` option.

:func:`compile_callables` replaces each callable on its own instance (``state_dict`` keys untouched) by an
:class:`EagerFallback`. Process-wide it raises dynamo's ``recompile_limit`` and sets inductor's
``fallback_random = True`` so compiled code draws torch's random numbers: seeded runs agree with compile on or off.
"""

from __future__ import annotations

import warnings
from functools import lru_cache
from typing import Any, Callable

import torch

RECOMPILE_LIMIT = 64  # dynamo cache entries per code object (see compile_callables)


@lru_cache(maxsize=None)
def compile_unavailable(device_type: str = "cpu") -> str | None:
    """Why ``torch.compile`` cannot run on ``device_type`` here (a probe, once per process), or None when it can."""
    if not hasattr(torch, "compile"):
        return f"torch {torch.__version__} has no torch.compile"
    try:
        probe = torch.compile(lambda x: torch.sigmoid(x) * 2.0 + 1.0, dynamic=False)
        x = torch.linspace(-1.0, 1.0, 8, device=device_type)
        if not torch.allclose(probe(x), torch.sigmoid(x) * 2.0 + 1.0):
            return "the compiled probe function gave a wrong result"
    except Exception as err:  # any backend failure means: run eager
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        return f"{type(err).__name__}: {first[:200]}"
    return None


class EagerFallback:
    """Calls ``compiled``; if its first call raises, warns and uses ``eager`` from then on (later errors raise)."""

    def __init__(self, eager: Callable, compiled: Callable, name: str):
        self.eager, self.compiled, self.name = eager, compiled, name
        self.state = "untried"  # untried -> compiled | eager

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.state == "eager":
            return self.eager(*args, **kwargs)
        if self.state == "compiled":
            return self.compiled(*args, **kwargs)
        try:
            out = self.compiled(*args, **kwargs)
        except Exception as err:
            warnings.warn(f"torch.compile of {self.name} failed ({type(err).__name__}: "
                          f"{str(err).strip().splitlines()[0][:200] if str(err).strip() else ''}); "
                          f"running it eager", RuntimeWarning, stacklevel=2)
            self.state = "eager"
            return self.eager(*args, **kwargs)
        self.state = "compiled"
        return out


def compile_callables(targets: dict[str, tuple[Any, str]], device_type: str = "cpu") -> bool:
    """Set ``owner.attr`` to a compiled :class:`EagerFallback` for each ``name: (owner, attr)`` of ``targets``.
    Returns False, with a ``RuntimeWarning`` and nothing changed, where ``torch.compile`` cannot run."""
    reason = compile_unavailable(device_type)
    if reason is not None:
        warnings.warn(f"compile=True: torch.compile cannot run on {device_type} here ({reason}); running eager. "
                      f"Set compile=false to silence this.", RuntimeWarning, stacklevel=2)
        return False
    import torch._dynamo.config as dynamo_config
    import torch._inductor.config as inductor_config

    inductor_config.fallback_random = True  # compiled code draws the same random numbers as eager code
    # instances of a class share one dynamo cache (8 MLPs x 3-4 call sites), past the default 8 it runs eager
    limit = max(RECOMPILE_LIMIT, int(getattr(dynamo_config, "recompile_limit", 0)))
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(dynamo_config, name):
            setattr(dynamo_config, name, limit)
    for name, (owner, attr) in targets.items():
        eager = getattr(owner, attr)
        setattr(owner, attr, EagerFallback(eager, torch.compile(eager, dynamic=False), name))
    return True
