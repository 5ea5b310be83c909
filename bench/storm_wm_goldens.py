"""Golden tensors of STORM's world-model update, made by STORM's own ``WorldModel.update`` (issue 44 item 3), for
tests/goldens/test_storm_world_model.py, which checks ``agent=storm``'s world-model step (``loss_layout: storm``,
absolute positions, no episode mask) against them with torch only.

    .venv/bin/python bench/storm_wm_goldens.py --source ~/.cache/reverie/storm-1c50658 \\
        --deps ~/.cache/reverie/storm-deps --out tests/goldens/data/storm1c50658_world_model.npz

(the STORM checkout and its small dependencies as for bench/storm_goldens.py). Runs ``WorldModel.update``
(``sub_models/world_models.py`` at 1c50658, unedited) in float64 on the CPU: its ``torch.autocast(device_type=
'cuda')`` and ``GradScaler`` disable themselves without CUDA, and float64 is the default dtype while the script
builds and runs it. STORM's ``WorldModel.__init__`` fixes 32 x 32 latents, 32-channel conv stacks and 64 x 64
images; the script builds it, then puts STORM's own modules of a small size in their place (``EncoderBN``,
``DecoderBN``, ``DistHead``, ``StochasticTransformerKVCache``; the reward and termination heads are built at the
transformer's width by ``__init__`` itself) and makes the optimiser again as ``__init__`` does (``Adam(lr=1e-4)``):
16 x 16 x 3 images (the encoder's two stride-2 stages down to 4 x 4; ``final_feature_width=16`` is the value that
makes its stage count two), stem 2 channels, 4 x 4 latents, a transformer 8 wide with 2 layers of 2 heads, dropout
0.1, position embeddings for 6 steps, 3 actions. Every parameter is set from :func:`pseudo` (a fixed integer hash,
so the test makes the same values without storing them; by the parameter's index in the sorted STORM names: norm
scales ``1 + 0.2 u``, biases ``0.2 u``, weights ``u sqrt(3 / fan_in)``, the latent heads' 0.8 times that, so that
the KL of some steps is below the free bits and their mean above).

Two updates, each on a seeded batch ``(B, L)`` = ``(2, 5)`` (images from :func:`images`; actions, rewards and
terminations stored). The random draws are recorded where they are made: the posterior samples
(``OneHotCategorical.sample``, the indices) and the dropout masks (``torch.nn.functional.dropout``, in call order,
each applied as ``x * (keep / (1 - p))``, which the test applies the same way). Recorded, flat in the orders
``meta`` lists (few entries keep the file small): ``batch<u>/<key>`` (STORM's batch-first layout), ``draw<u>``
``(B, L, S)`` indices, ``drop<u>`` (the keep masks, concatenated and bit-packed; shapes in ``meta["drops"]``),
``log<u>`` (what the update logs, ``meta["logs"]``: reconstruction, reward, termination, dynamics and
representation losses, their real KLs, the total), ``norm<u>``, ``grad1`` (update 1's gradients before clipping,
float32, the parameters in ``meta["params"]``), ``step`` (each parameter after update 2 minus its initial value,
float32) and ``buffers`` (the BatchNorm running statistics after update 2, ``meta["buffers"]``).
"""

from __future__ import annotations

import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

# `python bench/<script>.py` puts bench/ first on the import path; this tree's root goes there instead.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if os.path.abspath(sys.path[0] or ".") == os.path.dirname(os.path.abspath(__file__)):
    sys.path[0] = _ROOT
elif _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)
from bench.storm_goldens import SEED, cpu_for_cuda, save, storm_args  # noqa: E402  (the same commit, seed, format)

B, L, SIDE, STEM, S, D, HEADS, LAYERS, ACTIONS, MAX_LENGTH, DROPOUT = 2, 5, 16, 2, 4, 8, 2, 2, 3, 6, 0.1


def pseudo(n: int, k: int) -> np.ndarray:
    """``n`` float64 values in ``[-1, 1)`` from an integer hash of ``(i, k)`` (the same on every machine; the test
    imports it)."""
    mask = np.uint64(0xFFFFFFFF)
    x = (np.arange(n, dtype=np.uint64) * np.uint64(2654435761) + np.uint64(k) * np.uint64(40503)
         + np.uint64(12345)) & mask
    for _ in range(2):
        x = ((x ^ (x >> np.uint64(16))) * np.uint64(0x45D9F3B)) & mask
    x = x ^ (x >> np.uint64(16))
    return x.astype(np.float64) / 2.0 ** 31 - 1.0


def initial_value(name: str, shape: tuple[int, ...], k: int) -> np.ndarray:
    """The initial value of parameter ``name`` (index ``k`` in the sorted names): norm scales ``1 + 0.2 u``,
    biases ``0.2 u``, weights ``u sqrt(3 / fan_in)``, 0.8 times that in the latent heads (the test imports it)."""
    u = pseudo(int(np.prod(shape)), k).reshape(shape)
    if name.endswith("bias"):
        return 0.2 * u
    if len(shape) == 1:
        return 1.0 + 0.2 * u
    scale = 0.8 if name.startswith("dist_head.") else 1.0  # the steps' KLs straddle the free bits (1)
    return scale * u * np.sqrt(3.0 / np.prod(shape[1:]))


def images(u: int) -> np.ndarray:
    """Batch ``u``'s observations ``(B, L, 3, SIDE, SIDE)`` uint8 from :func:`pseudo` (the test imports it)."""
    shape = (B, L, 3, SIDE, SIDE)
    return np.clip(np.floor((pseudo(int(np.prod(shape)), 1000 + u) + 1.0) * 128.0), 0, 255).astype(np.uint8) \
        .reshape(shape)


def build():
    """STORM's ``WorldModel`` with its own modules at the small size (module docstring)."""
    from sub_models.transformer_model import StochasticTransformerKVCache
    from sub_models.world_models import DecoderBN, DistHead, EncoderBN, WorldModel

    wm = WorldModel(in_channels=3, action_dim=ACTIONS, transformer_max_length=MAX_LENGTH, transformer_hidden_dim=D,
                    transformer_num_layers=LAYERS, transformer_num_heads=HEADS)
    wm.stoch_dim, wm.stoch_flattened_dim = S, S * S
    wm.encoder = EncoderBN(in_channels=3, stem_channels=STEM, final_feature_width=16)  # 16 -> 8 -> 4
    wm.storm_transformer = StochasticTransformerKVCache(stoch_dim=S * S, action_dim=ACTIONS, feat_dim=D,
                                                        num_layers=LAYERS, num_heads=HEADS, max_length=MAX_LENGTH,
                                                        dropout=DROPOUT)
    wm.dist_head = DistHead(image_feat_dim=wm.encoder.last_channels * 4 * 4, transformer_hidden_dim=D, stoch_dim=S)
    wm.image_decoder = DecoderBN(stoch_dim=S * S, last_channels=wm.encoder.last_channels, original_in_channels=3,
                                 stem_channels=STEM, final_feature_width=4)
    names = sorted(n for n, _ in wm.named_parameters())
    with torch.no_grad():
        for name, p in wm.named_parameters():
            p.copy_(torch.as_tensor(initial_value(name, tuple(p.shape), names.index(name))))
    wm.optimizer = torch.optim.Adam(wm.parameters(), lr=1e-4)  # as WorldModel.__init__, over the new modules
    return wm


def main() -> None:
    args = storm_args(__doc__)
    cpu_for_cuda()
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64)
    torch.manual_seed(SEED)
    wm = build()
    init = {n: p.detach().clone() for n, p in wm.named_parameters()}
    g = torch.Generator().manual_seed(SEED)

    seen: dict = {}
    draws: list[torch.Tensor] = []
    masks: list[torch.Tensor] = []

    def recorded_sample(self, sample_shape=torch.Size()):
        probs = self.probs  # (B, L, S, K)
        index = torch.multinomial(probs.reshape(-1, probs.shape[-1]), 1, generator=g).view(probs.shape[:-1])
        draws.append(index)
        return F.one_hot(index, probs.shape[-1]).to(probs.dtype)

    def recorded_dropout(x, p=0.5, training=True, inplace=False):
        if not training or p == 0.0:
            return x
        keep = torch.rand(x.shape, generator=g) >= p
        masks.append(keep)
        return x * (keep.to(x.dtype) / (1.0 - p))

    clip = torch.nn.utils.clip_grad_norm_
    names = {p: n for n, p in wm.named_parameters()}
    order = sorted(names.values())

    def recording_clip(params, max_norm, *a, **k):
        params = list(params)
        grads = {names[p]: p.grad.detach() for p in params if p.grad is not None}
        seen["grad"] = torch.cat([grads[n].flatten() for n in order]).float().numpy()
        norm = clip(params, max_norm, *a, **k)
        seen["norm"] = np.asarray(float(norm))
        return norm

    logs = ("reconstruction_loss", "reward_loss", "termination_loss", "dynamics_loss", "dynamics_real_kl_div",
            "representation_loss", "representation_real_kl_div", "total_loss")

    class Log:
        def log(self, tag, value):
            seen[tag.split("/")[-1]] = float(value)

    torch.distributions.OneHotCategorical.sample = recorded_sample
    torch.nn.functional.dropout = recorded_dropout
    torch.nn.utils.clip_grad_norm_ = recording_clip
    out: dict[str, np.ndarray] = {}
    for u in (1, 2):
        batch = {"action": torch.randint(0, ACTIONS, (B, L), generator=g).numpy().astype(np.int8),
                 "reward": np.where(torch.rand(B, L, generator=g).numpy() < 0.4, 0.0,
                                    np.round(3.0 * torch.randn(B, L, generator=g).numpy(), 2)),
                 "termination": (torch.rand(B, L, generator=g) < 0.2).numpy()}
        seen.clear()
        draws.clear()
        masks.clear()
        wm.update(torch.as_tensor(images(u)).double() / 255.0, torch.as_tensor(batch["action"]).long(),
                  torch.as_tensor(batch["reward"]), torch.as_tensor(batch["termination"]).double(), logger=Log())
        assert len(draws) == 1 and len(masks) == 3 * LAYERS, (len(draws), len(masks))
        out |= {f"batch{u}/{k}": v for k, v in batch.items()}
        out[f"draw{u}"] = draws[0].numpy().astype(np.int8)
        out[f"drop{u}"] = np.packbits(torch.cat([m.flatten() for m in masks]).numpy())
        drops = [list(m.shape) for m in masks]
        out[f"log{u}"] = np.asarray([seen[tag] for tag in logs])
        out[f"norm{u}"] = seen["norm"]
        if u == 1:
            out["grad1"] = seen["grad"]
    params = dict(wm.named_parameters())
    out["step"] = torch.cat([(params[n].detach() - init[n]).flatten() for n in order]).float().numpy()
    buffers = sorted(n for n in dict(wm.named_buffers()) if "running" in n and
                     n.split(".")[0] in ("encoder", "image_decoder"))
    out["buffers"] = torch.cat([dict(wm.named_buffers())[n].flatten() for n in buffers]).float().numpy()
    save(out, {"B": B, "L": L, "side": SIDE, "stem": STEM, "stoch": S, "classes": S, "deter": D, "heads": HEADS,
               "layers": LAYERS, "actions": ACTIONS, "max_length": MAX_LENGTH, "dropout": DROPOUT, "lr": 1e-4,
               "clip": 1000.0, "free_bits": 1.0, "dtype": "float64", "logs": logs, "drops": drops,
               "params": [[n, list(params[n].shape)] for n in order],
               "buffers": [[n, list(dict(wm.named_buffers())[n].shape)] for n in buffers]},
         "bench/storm_wm_goldens.py", args.out)

if __name__ == "__main__":
    main()
