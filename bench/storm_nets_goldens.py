"""Golden tensors of STORM's image encoder, decoder and heads, made by STORM's own modules (issue 44 item 3), for
tests/goldens/test_storm_nets.py, which checks :mod:`reverie.models.storm_nets` against them with torch only.

    .venv/bin/python bench/storm_nets_goldens.py --source ~/.cache/reverie/storm-1c50658 \\
        --deps ~/.cache/reverie/storm-deps --out tests/goldens/data/storm1c50658_nets.npz

(the STORM checkout and its small dependencies as for bench/storm_goldens.py). Runs STORM's ``EncoderBN``,
``DecoderBN``, ``RewardDecoder`` and ``TerminationDecoder`` (``sub_models/world_models.py`` at 1c50658, unedited)
at a small size (stem 4 channels, 64 x 64 x 3 images, a 32-wide latent, 16-wide heads), their parameters moved by
seeded noise (seed 0), on a seeded batch ``(B, L)``: in training mode (batch statistics) the outputs, a scalar loss
``sum(output * cos(0.7 i))`` and its gradients with respect to every parameter and (but the
encoder's pixels, kept as bytes) the input, and the
BatchNorm running statistics after that pass (``after/``); then in eval mode (running statistics) the outputs again. Recorded
batch-first as STORM holds them; ``meta`` has the sizes, commit and command.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from storm_goldens import SEED, save, storm_args  # noqa: E402  (the same commit, seed and file format)

B, L, STEM, Z, H, CHANNELS = 2, 2, 4, 32, 16, 3


def loss_weights(shape: tuple[int, ...]) -> torch.Tensor:
    """The fixed weights of the scalar loss ``sum(output * w)``: ``cos(0.7 i)`` over the flat index ``i`` (the test
    makes them the same way)."""
    n = int(np.prod(shape))
    return torch.cos(0.7 * torch.arange(n, dtype=torch.float64)).float().view(shape)


def run(module: torch.nn.Module, name: str, x: torch.Tensor, g: torch.Generator, out: dict) -> None:
    """Training-mode pass with gradients, then an eval-mode pass; records into ``out`` under ``name/``."""
    out |= {f"{name}/init/{k}": v.detach().clone().numpy() for k, v in module.state_dict().items()}
    pixels = x.dtype == torch.uint8  # the encoder: STORM reads [0, 1] floats, the golden keeps the bytes
    x_in = x.float() / 255.0 if pixels else x.clone().requires_grad_()
    module.train()
    y = module(x_in)
    (y * loss_weights(y.shape)).sum().backward()
    out[f"{name}/input"] = x.numpy()
    out[f"{name}/train_out"] = y.detach().numpy()
    if not pixels:
        out[f"{name}/input_grad"] = x_in.grad.numpy()
    out |= {f"{name}/grad/{k}": p.grad.numpy() for k, p in module.named_parameters()}
    out |= {f"{name}/after/{k}": v.detach().clone().numpy() for k, v in module.named_buffers()}  # running stats
    module.eval()
    with torch.no_grad():
        out[f"{name}/eval_out"] = module(x_in.detach()).numpy()


def main() -> None:
    args = storm_args(__doc__)
    torch.set_num_threads(1)
    from sub_models.world_models import DecoderBN, EncoderBN, RewardDecoder, TerminationDecoder

    torch.manual_seed(SEED)
    g = torch.Generator().manual_seed(SEED)
    encoder = EncoderBN(in_channels=CHANNELS, stem_channels=STEM, final_feature_width=4)
    decoder = DecoderBN(stoch_dim=Z, last_channels=encoder.last_channels, original_in_channels=CHANNELS,
                        stem_channels=STEM, final_feature_width=4)
    reward = RewardDecoder(num_classes=255, embedding_size=Z, transformer_hidden_dim=H)
    termination = TerminationDecoder(embedding_size=Z, transformer_hidden_dim=H)
    with torch.no_grad():  # seeded noise: no unit BatchNorm scale or zero bias hides a swapped entry
        for module in (encoder, decoder, reward, termination):
            for p in module.parameters():
                p.add_(0.1 * torch.randn(p.shape, generator=g))
    obs = torch.randint(0, 256, (B, L, CHANNELS, 64, 64), generator=g).to(torch.uint8)  # STORM reads obs / 255
    out: dict[str, np.ndarray] = {}
    run(encoder, "encoder", obs, g, out)
    run(decoder, "decoder", torch.randn(B, L, Z, generator=g), g, out)
    run(reward, "reward", torch.randn(B, L, H, generator=g), g, out)
    run(termination, "termination", torch.randn(B, L, H, generator=g), g, out)
    save(out, {"B": B, "L": L, "stem": STEM, "z": Z, "h": H, "channels": CHANNELS}, "bench/storm_nets_goldens.py",
         args.out)


if __name__ == "__main__":
    main()
