"""The world model of the current official DreamerV3 (danijar/dreamerv3 at e3f0224, ``dreamerv3/agent.py:38-58,
156-186``; ``dreamerv3/rssm.py`` ``Encoder``, ``Decoder``): the one :class:`reverie.models.world_model.WorldModel`
with :func:`reverie.models.world_model.dreamer2025_nets`, the block-GRU RSSM and the continue target
``(1 - is_terminal) * (1 - 1/horizon)`` (``contdisc``, ``agent.py:174-177``)."""

from __future__ import annotations

from typing import Any, Callable

from reverie.models.world_model import WorldModel, dreamer2025_nets


def world_model_2025(obs_shapes: dict[str, tuple[int, ...]], action_dim: int,
                     dynamics: Callable[..., Any] | dict | None = None, units: int = 1024, enc_layers: int = 3,
                     dec_layers: int = 3, reward_layers: int = 1, cont_layers: int = 1, cnn_depth: int = 64,
                     cnn: dict | None = None, reward_bins: int = 255, cont_discount: float = 1.0 - 1.0 / 333.0,
                     kernels: str = "auto", representation: str = "reconstruction",
                     objectives: dict | None = None) -> WorldModel:
    """The 2025 world model over ``obs_shapes``: ``dynamics`` a factory ``(action_dim=A, embed_dim=E)`` or
    :class:`reverie.models.dynamics.BlockRSSM` settings (None: its defaults); ``cnn``: the conv stacks' settings.
    ValueError as :class:`WorldModel`."""
    nets = dreamer2025_nets(units, enc_layers, dec_layers, reward_layers, cont_layers, cnn_depth, cnn, reward_bins)
    return WorldModel(obs_shapes, action_dim, dynamics, nets=nets, cont_discount=cont_discount, kernels=kernels,
                      representation=representation, objectives=objectives)
