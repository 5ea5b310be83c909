"""Small agents for the tests: keyword arguments of DreamerV3 and PlaNet with tiny sizes (``size=debug`` by default),
the dynamics' own sizes in their ``dynamics`` factory as the config's ``agent.module.dynamics`` block holds them."""

from __future__ import annotations

from functools import partial

import numpy as np

from reverie.models.dynamics import CategoricalRSSM, GaussianRSSM


def dreamer(deter: int = 32, stoch: int = 4, classes: int = 4, units: int = 32, layers: int = 1, horizon: int = 4,
            precision: str = "float32", kernels: str = "auto", **kwargs) -> dict:
    """``DreamerV3(obs_shapes, spec, **dreamer(...))``: size=debug and exp=debug's horizon and precision."""
    dynamics = partial(CategoricalRSSM, deter=deter, stoch=stoch, classes=classes, units=units, kernels=kernels)
    kwargs = {"mlp_units": units, "mlp_layers": layers, **kwargs}  # size=debug's vector encoder/decoder (exp=debug)
    return dict(dynamics=dynamics, units=units, layers=layers, horizon=horizon, precision=precision, kernels=kernels,
                **kwargs)


def planet(deter: int = 16, stoch: int = 4, units: int = 16, min_std: float = 0.1, free_nats: float = 3.0,
           overshooting: int = 0, act: str = "relu", head_units: int = 16, head_layers: int = 1, **kwargs) -> dict:
    """``PlaNet(obs_shapes, spec, **planet(...))``: exp=debug's PlaNet sizes."""
    dynamics = partial(GaussianRSSM, deter=deter, stoch=stoch, units=units, min_std=min_std, free_nats=free_nats,
                       overshooting=overshooting, act=act)
    return dict(dynamics=dynamics, units=units, act=act, head_units=head_units, head_layers=head_layers, **kwargs)


def vector_batch(T: int = 6, B: int = 3, F: int = 4, A: int = 2, seed: int = 0, discrete: bool = True) -> dict:
    """A replay batch of ``F`` vector features, time-first ``(T, B, ...)``: standard-normal obs and rewards, one episode
    per column (``is_first`` at row 0), and the previous action, zero at row 0: one-hot of ``A`` actions
    (``discrete``) or uniform in [-1, 1]^A."""
    rng = np.random.default_rng(seed)
    is_first = np.zeros((T, B), bool)
    is_first[0] = True
    vector = rng.normal(size=(T, B, F)).astype(np.float32)
    if discrete:
        action = np.eye(A, dtype=np.float32)[rng.integers(A, size=(T, B))]
    else:
        action = rng.uniform(-1, 1, size=(T, B, A)).astype(np.float32)
    return {"vector": vector, "prev_action": action * ~is_first[..., None],
            "reward": rng.normal(size=(T, B)).astype(np.float32), "is_first": is_first,
            "is_last": np.zeros((T, B), bool), "is_terminal": np.zeros((T, B), bool)}
