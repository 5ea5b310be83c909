"""Golden tensors of STORM's actor-critic update, made by STORM's own ``ActorCriticAgent`` (issue 44 item 3), for
tests/goldens/test_storm_actor_critic.py, which checks reverie's :class:`reverie.agents.storm.StormActorCritic`
against them with torch only.

    git clone https://github.com/weipu-zhang/STORM /tmp/STORM
    mkdir -p ~/.cache/reverie/storm-1c50658
    git -C /tmp/STORM archive 1c50658 | tar -x -C ~/.cache/reverie/storm-1c50658
    .venv/bin/python -m pip install --target ~/.cache/reverie/storm-deps einops tensorboardX yacs
    .venv/bin/python bench/storm_goldens.py --source ~/.cache/reverie/storm-1c50658 \\
        --deps ~/.cache/reverie/storm-deps --out tests/goldens/data/storm1c50658_actor_critic.npz

Runs with this project's torch (CPU) and STORM's ``agents.py`` imported from ``--source`` (weipu-zhang/STORM at
1c50658), unedited. STORM's code asks for CUDA in two places (``calc_lambda_return``'s ``torch.zeros(...,
device="cuda")`` and ``torch.ones(1).cuda()``); this script maps those to the CPU for its own process. Its
``torch.autocast(device_type='cuda')`` and ``GradScaler`` disable themselves without CUDA, so the update runs in
float32. Its other imports (``utils``: tensorboardX, yacs; ``einops``) come from ``--deps``.

The agent is built at a small size (feature width 24, 2 layers of 16 units, 5 actions; STORM's gamma 0.985,
lambda 0.95, entropy 3e-4), its parameters (actor, critic and slow critic, each independently) moved by seeded
noise so no zero bias or unit LayerNorm scale hides a swapped entry; then two ``update`` calls on two batches of
``(B, L)`` imagined rows (seeded: latents ``(B, L+1, 24)``, actions, rewards, terminations). Recorded: ``init/<name>``
(the parameters, STORM's names), ``batch<u>/<key>`` (STORM's batch-first layout), ``log<u>/<tag>`` (what the update
logs: policy, value and entropy losses, S, norm_ratio, total loss), ``grad<u>/<name>`` (the gradients before
clipping), ``norm<u>`` (the norm ``clip_grad_norm_`` returned), ``param<u>/<name>`` (after update ``u``), and
``meta`` (commit, sizes, seed, command).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

COMMIT = "1c50658"
SEED = 0
FEAT, LAYERS, UNITS, ACTIONS = 24, 2, 16, 5
B, L = 6, 8


def cpu_for_cuda() -> None:
    """Map STORM's two CUDA requests to the CPU (this process only)."""
    zeros = torch.zeros

    def cpu_zeros(*args, device=None, **kwargs):
        return zeros(*args, device=None if str(device) == "cuda" else device, **kwargs)

    torch.zeros = cpu_zeros
    torch.Tensor.cuda = lambda self, *args, **kwargs: self


def make_batch(g: torch.Generator) -> dict[str, torch.Tensor]:
    """One imagined batch, batch-first as STORM's ``update`` takes it."""
    return {"latent": torch.randn(B, L + 1, FEAT, generator=g),
            "action": torch.randint(0, ACTIONS, (B, L), generator=g),
            "reward": 30.0 * torch.randn(B, L, generator=g),  # spread enough that the return scale S exceeds 1
            "termination": (torch.rand(B, L, generator=g) < 0.15).float()}


def storm_args(doc: str) -> argparse.Namespace:
    """``--source`` (STORM at 1c50658), ``--deps`` and ``--out``; puts STORM's modules and its small dependencies on
    ``sys.path``."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", required=True, help="weipu-zhang/STORM at 1c50658")
    parser.add_argument("--deps", required=True, help="a pip --target folder with einops, tensorboardX, yacs")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(args.source).resolve()))
    sys.path.append(str(Path(args.deps).resolve()))  # after site-packages: this project's numpy and torch win
    return args


def main() -> None:
    args = storm_args(__doc__)
    cpu_for_cuda()
    import agents  # STORM's agents.py

    torch.manual_seed(SEED)
    agent = agents.ActorCriticAgent(feat_dim=FEAT, num_layers=LAYERS, hidden_dim=UNITS, action_dim=ACTIONS,
                                    gamma=0.985, lambd=0.95, entropy_coef=3e-4)
    g = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for p in agent.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=g))
    out = {f"init/{k}": v.clone().numpy() for k, v in agent.state_dict().items()}

    clip = torch.nn.utils.clip_grad_norm_
    names = {p: n for n, p in agent.named_parameters()}
    seen: dict[str, np.ndarray] = {}

    def recording_clip(params, max_norm, *a, **k):
        params = list(params)
        for p in params:
            if p.grad is not None:
                seen[f"grad/{names[p]}"] = p.grad.detach().clone().numpy()
        norm = clip(params, max_norm, *a, **k)
        seen["norm"] = np.asarray(float(norm))
        return norm

    torch.nn.utils.clip_grad_norm_ = recording_clip

    class Log:
        def log(self, tag, value):
            seen[f"log/{tag.split('/')[-1]}"] = np.asarray(value)

    for u in (1, 2):
        batch = make_batch(g)
        seen.clear()
        agent.update(batch["latent"], batch["action"], None, None, batch["reward"], batch["termination"],
                     logger=Log())
        out |= {f"batch{u}/{k}": v.numpy() for k, v in batch.items()}
        out |= {f"{k.split('/')[0]}{u}/{k.split('/', 1)[1]}" if "/" in k else f"{k}{u}": v for k, v in seen.items()}
        out |= {f"param{u}/{k}": v.clone().numpy() for k, v in agent.state_dict().items()}
        out[f"ema{u}"] = np.asarray([float(agent.lowerbound_ema.get()), float(agent.upperbound_ema.get())])
    save(out, {"feat": FEAT, "layers": LAYERS, "units": UNITS, "actions": ACTIONS, "B": B, "L": L, "gamma": 0.985,
               "lambda": 0.95, "entropy_coef": 3e-4}, "bench/storm_goldens.py", args.out)


def save(out: dict[str, np.ndarray], sizes: dict, script: str, path: str) -> None:
    """Write ``out`` plus its ``meta`` (commit, seed, torch, ``sizes`` and the command) to ``path`` (npz)."""
    out["meta"] = np.asarray(json.dumps({"commit": COMMIT, "seed": SEED, **sizes, "torch": torch.__version__,
                                         "command": f"{script} --source <STORM at 1c50658> --deps <einops, "
                                                    f"tensorboardX, yacs> --out {path}"}))
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path, **out)
    print(f"wrote {path}: {len(out)} arrays, {Path(path).stat().st_size / 1e3:.0f} kB")


if __name__ == "__main__":
    main()
