"""``torch.compile`` with a clean eager fallback, for the agents' ``compile`` option.

An agent passes the callables worth compiling (the RSSM cell, its MLP heads) to :func:`compile_callables`. Each
one is replaced, on its own instance (parameters, ``state_dict`` keys and checkpoints are untouched), by a
:class:`EagerFallback` that calls the compiled version and, if compiling fails at the first call (no C++
compiler for inductor, an op it cannot lower, ...), warns once and runs the eager original from then on.

Process-wide settings changed by :func:`compile_callables`:

- ``torch._dynamo.config.recompile_limit`` is raised to :data:`RECOMPILE_LIMIT`: instances of one module class
  share their forward's code object, hence one dynamo cache, and past the limit dynamo silently runs eager;
- ``torch._inductor.config.fallback_random = True``: inductor normally generates its own random numbers, so a
  compiled run would sample other latents and actions than an eager run with the same seed; with it, compiled
  code draws from torch's own generator as eager code does, and seeded runs agree with the option on or off,
  within float tolerance.
"""

from __future__ import annotations

import warnings
from functools import lru_cache
from typing import Any, Callable

import torch

RECOMPILE_LIMIT = 64  # dynamo cache entries per code object (see compile_callables)


@lru_cache(maxsize=None)
def compile_unavailable(device_type: str = "cpu") -> str | None:
    """Why ``torch.compile`` cannot run on ``device_type`` here, or None when it can.

    Compiles and runs a two-op probe function once per process (a few seconds the first time; inductor caches
    the kernel on disk). On CPU inductor needs a C++ compiler; on CUDA, Triton.
    """
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
    """Calls ``compiled``; if its first call raises, warns and uses ``eager`` from then on.

    A failure after a successful first call is re-raised (it is an error of the inputs, not of the compiler).
    """

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
    """Replace ``getattr(owner, attr)`` by a compiled :class:`EagerFallback` for each ``name: (owner, attr)``.

    Args:
        targets: e.g. ``{"dynamics cell": (dynamics, "_cell"), "critic": (critic, "forward")}``; the attribute is
            set on the instance, so the class and other instances stay eager.
        device_type: where the compiled code runs (``"cpu"``, ``"cuda"``), for the availability probe.

    Returns:
        True if compiled; False (with a ``RuntimeWarning`` naming the reason) if ``torch.compile`` cannot run
        here, in which case nothing is changed.
    """
    reason = compile_unavailable(device_type)
    if reason is not None:
        warnings.warn(f"compile=True: torch.compile cannot run on {device_type} here ({reason}); running eager. "
                      f"Set compile=false to silence this.", RuntimeWarning, stacklevel=2)
        return False
    import torch._dynamo.config as dynamo_config
    import torch._inductor.config as inductor_config

    inductor_config.fallback_random = True  # compiled code draws the same random numbers as eager code
    # Instances of one class share their forward's code object, and dynamo keeps one cache per code object: every
    # instance x shape x grad mode is one entry (8 MLPs x 3-4 call sites here), past the default limit of 8, after
    # which it silently runs eager.
    limit = max(RECOMPILE_LIMIT, int(getattr(dynamo_config, "recompile_limit", 0)))
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(dynamo_config, name):
            setattr(dynamo_config, name, limit)
    for name, (owner, attr) in targets.items():
        eager = getattr(owner, attr)
        setattr(owner, attr, EagerFallback(eager, torch.compile(eager, dynamic=False), name))
    return True
