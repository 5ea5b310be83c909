"""Latent dynamics behind one protocol (:class:`Dynamics`): DreamerV3's categorical RSSM, PlaNet's Gaussian RSSM,
the official block-GRU RSSM and a STORM-style transformer (``dynamics=storm``), built from ``agent.module.dynamics``."""

from reverie.models.dynamics.base import (ContextSpec, Dynamics, RowState, State, check_dynamics, free_bits, rollout,
                                          row_starts)
from reverie.models.dynamics.block import BlockGRU, BlockRSSM
from reverie.models.dynamics.categorical import CategoricalRSSM, GRUCell, kl_losses, scale_action
from reverie.models.dynamics.gaussian import (GaussianRSSM, free_nats_hinge, gaussian_kl, overshooting_kl,
                                              overshooting_loss)
from reverie.models.dynamics.transformer import TransformerDynamics

__all__ = ["ContextSpec", "Dynamics", "RowState", "State", "BlockGRU", "BlockRSSM", "CategoricalRSSM", "GaussianRSSM",
           "GRUCell", "TransformerDynamics", "check_dynamics", "free_bits", "free_nats_hinge", "rollout", "row_starts",
           "kl_losses", "gaussian_kl", "overshooting_kl", "overshooting_loss", "scale_action"]
