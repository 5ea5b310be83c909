"""Plain ``nn.Module``s and distributions: no optimisers, no configs, no devices. ``dynamics/``: the latent
dynamics behind one protocol; ``kernels/``: optional hand-written fast paths behind ``agent.module.kernels``;
``world_model.py``: encoders + dynamics + decoders and heads (docs/architecture.md)."""
