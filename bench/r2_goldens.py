"""Golden tensors of R2-Dreamer's representation loss inside its own update (issue 44 item 3), made by running
NM512/r2dreamer's ``Dreamer.update`` (at 546e4fa, unedited) for tests/goldens/test_r2_goldens.py, which checks
reverie's :class:`reverie.models.representation.BarlowTwins` and :class:`~reverie.models.representation.InfoNCE`
against them with torch only.

    mkdir -p ~/.cache/reverie/r2dreamer-546e4fa
    git -C <an r2dreamer clone> archive 546e4fa | tar -x -C ~/.cache/reverie/r2dreamer-546e4fa
    .venv/bin/python -m pip install --no-deps --target ~/.cache/reverie/r2-deps tensordict pyvers orjson cloudpickle
    .venv/bin/python bench/r2_goldens.py --source ~/.cache/reverie/r2dreamer-546e4fa \\
        --deps ~/.cache/reverie/r2-deps --out tests/goldens/data/r2dreamer546e4fa_representation.npz

Runs with this project's torch (CPU, float32) and r2dreamer's modules imported from ``--source``. The config is
composed by r2dreamer's own Hydra files (``configs/configs.yaml`` with ``env=dmc_vision``), so every value it does
not override is the one r2dreamer uses; the overrides make the model small (deter 64 in 8 blocks, hidden 32, 4 x 4
latents, CNN depth 2, 32 units) and put it on the CPU without ``torch.compile``. r2dreamer's ``update`` wraps the
gradient pass in ``autocast(float16)`` for its GPU; this script replaces that one name with a disabled autocast for
its own process, so the update runs in float32 (its ``GradScaler`` disables itself without CUDA).

For each objective (``rep_loss`` ``r2dreamer`` and ``infonce``) the agent is built with seed 0, its parameters moved
by seeded noise (no zero bias or unit norm scale hides a swapped entry), and two ``update`` calls run on two
seeded replay batches ``(B, T)`` (64 x 64 x 3 images, 2 continuous actions). Recorded per update ``u`` (batch-first,
as r2dreamer holds them): ``<case>/feat<u>`` (``(B, T, F)``: what the projector reads), ``<case>/embed<u>``
(``(B, T, E)``: the encoder's output), ``<case>/loss<u>`` (``loss/barlow`` or ``loss/infonce`` of the update's
metrics, unscaled), ``<case>/feat_grad<u>`` (the gradient of the update's total loss reaching the projector's input:
only the representation loss reads it), ``<case>/proj_grad<u>`` (the projector weight's gradient before clipping)
``<case>/proj<u>`` (the weight after the update; ``proj0`` before), LaProp's state for that weight after the update
(``exp_avg<u>``, ``exp_avg_sq<u>``, ``lr_avg<u>``: its ``exp_avg_lr_1``), and ``meta`` (commit, sizes, scales, seed,
command).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

import numpy as np
import torch

COMMIT = "546e4fa"
SEED = 0
B, T, ACTIONS = 4, 8, 2
OVERRIDES = ["env=dmc_vision", "device=cpu", "model.compile=False", "model.deter=64", "model.hidden=32",
             "model.discrete=4", "model.rssm.stoch=4", "model.depth=2", "model.units=32"]
CASES = {"r2": "r2dreamer", "infonce": "infonce"}


def compose(source: Path, rep_loss: str):
    """r2dreamer's config, composed by its own Hydra files with :data:`OVERRIDES`."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(source / "configs"), version_base=None):
        return hydra_compose("configs", overrides=OVERRIDES + [f"model.rep_loss={rep_loss}"])


class Replay:
    """The two methods ``Dreamer.update`` calls on r2dreamer's replay buffer: ``sample`` hands out the next
    recorded batch; ``update`` (the stored latents) is not needed here."""

    def __init__(self, batches):
        self.batches = list(batches)

    def sample(self):
        return self.batches.pop(0)

    def update(self, index, stoch, deter):
        pass


def make_batch(g: torch.Generator, agent, act_dim: int):
    """One replay batch as r2dreamer's ``Buffer.sample`` returns it: ``(data (B, T), index, initial)``."""
    from tensordict import TensorDict

    is_first = torch.zeros(B, T, 1, dtype=torch.bool)
    is_first[:, 0] = True
    is_first[1, 5] = True  # an episode starts inside one row
    data = TensorDict({
        "image": torch.randint(0, 256, (B, T, 64, 64, 3), generator=g, dtype=torch.uint8),
        "action": torch.rand(B, T, act_dim, generator=g) * 2 - 1,
        "reward": torch.randn(B, T, 1, generator=g),
        "is_first": is_first,
        "is_last": torch.zeros(B, T, 1, dtype=torch.bool),
        "is_terminal": torch.zeros(B, T, 1, dtype=torch.bool),
    }, batch_size=(B, T))
    stoch, deter = agent.rssm.initial(B)
    return data, None, (stoch.detach(), deter.detach())


def run_case(source: Path, rep_loss: str) -> tuple[dict[str, np.ndarray], dict]:
    """Two r2dreamer updates with objective ``rep_loss``; the arrays (module docstring) and the scales."""
    import gymnasium as gym

    import dreamer as r2

    r2.autocast = lambda device_type, dtype: torch.autocast(device_type, dtype=dtype, enabled=False)
    config = compose(source, rep_loss)
    torch.manual_seed(SEED)
    obs_space = gym.spaces.Dict({"image": gym.spaces.Box(0, 255, (64, 64, 3), np.uint8)})
    act_space = gym.spaces.Box(-1.0, 1.0, (ACTIONS,), np.float32)
    with contextlib.redirect_stdout(sys.stderr):
        agent = r2.Dreamer(config.model, obs_space, act_space)
    g = torch.Generator().manual_seed(SEED)
    with torch.no_grad():  # seeded noise: no zero bias or unit scale hides a swapped entry
        for p in agent._named_params.values():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    agent.clone_and_freeze()  # the frozen copies r2dreamer's update reads follow the moved parameters
    out: dict[str, np.ndarray] = {"proj0": agent.prj.w.weight.detach().numpy().copy()}
    seen: dict[str, torch.Tensor] = {}

    def projector_input(module, args):
        x = args[0]
        seen["feat"] = x.detach().clone()
        x.register_hook(lambda grad: seen.__setitem__("feat_grad", grad.detach().clone()))

    def encoder_output(module, args, output):
        seen["embed"] = output.detach().clone()

    agent.prj.register_forward_pre_hook(projector_input)
    agent.encoder.register_forward_hook(encoder_output)
    agent.prj.w.weight.register_hook(lambda grad: seen.__setitem__("proj_grad", grad.detach().clone()))
    key = "barlow" if rep_loss == "r2dreamer" else "infonce"
    replay = Replay([make_batch(g, agent, ACTIONS) for _ in range(2)])
    for u in (1, 2):
        metrics = agent.update(replay)
        out[f"feat{u}"] = seen["feat"].view(B, T, -1).numpy()
        out[f"embed{u}"] = seen["embed"].numpy()
        out[f"feat_grad{u}"] = seen["feat_grad"].view(B, T, -1).numpy()
        out[f"proj_grad{u}"] = seen["proj_grad"].numpy()
        out[f"proj{u}"] = agent.prj.w.weight.detach().numpy().copy()
        out[f"loss{u}"] = np.asarray(float(metrics[f"loss/{key}"].detach()), np.float64)
        state = agent._optimizer.state[agent.prj.w.weight]
        out[f"exp_avg{u}"] = state["exp_avg"].numpy().copy()
        out[f"exp_avg_sq{u}"] = state["exp_avg_sq"].numpy().copy()
        out[f"lr_avg{u}"] = np.asarray(state["exp_avg_lr_1"], np.float64)
    scales = {"scale": float(config.model.loss_scales[key]), "lambd": float(config.model.r2dreamer.lambd),
              "lr": float(config.model.lr), "agc": float(config.model.agc), "pmin": float(config.model.pmin),
              "eps": float(config.model.eps), "beta1": float(config.model.beta1),
              "beta2": float(config.model.beta2), "warmup": int(config.model.warmup)}
    return out, scales


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", type=Path, required=True, help="r2dreamer at 546e4fa")
    parser.add_argument("--deps", type=Path, required=True, help="tensordict and its small dependencies")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    sys.path[:0] = [str(args.source), str(args.deps)]
    torch.set_num_threads(1)
    arrays: dict[str, np.ndarray] = {}
    meta = {"commit": COMMIT, "seed": SEED, "B": B, "T": T, "actions": ACTIONS, "overrides": OVERRIDES,
            "command": f"bench/r2_goldens.py --source <r2dreamer at {COMMIT}> --deps <tensordict and its small "
                       f"dependencies> --out {args.out}", "cases": {}}
    for case, rep_loss in CASES.items():
        out, scales = run_case(args.source, rep_loss)
        arrays |= {f"{case}/{k}": v for k, v in out.items()}
        meta["cases"][case] = {"rep_loss": rep_loss} | scales
    arrays["meta"] = np.asarray(json.dumps(meta))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out, **arrays)
    print(f"wrote {args.out} ({args.out.stat().st_size / 1e3:.0f} kB): "
          + ", ".join(f"{c}: losses {arrays[f'{c}/loss1']:.6g}, {arrays[f'{c}/loss2']:.6g}" for c in CASES))


if __name__ == "__main__":
    main()
