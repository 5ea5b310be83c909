"""STORM's image encoder, decoder and heads, tensor by tensor against STORM's own modules (issue 44 item 3).

The golden (tests/goldens/data/storm1c50658_nets.npz) was made by STORM's ``EncoderBN``, ``DecoderBN``,
``RewardDecoder`` and ``TerminationDecoder`` at weipu-zhang/STORM 1c50658 (bench/storm_nets_goldens.py; its ``meta``
holds the command): a training-mode pass with the gradients of ``sum(output * cos(0.7 i))`` and the BatchNorm running
statistics after it, then an eval-mode pass. Here :mod:`reverie.models.storm_nets` gets the same parameters (mapped by
name) and must give the same outputs (the decoder's minus 0.5: reverie's image space, the continue head's negated:
a continue logit), gradients and running statistics; its BatchNorm uses the running statistics without gradients
(acting, imagination) where STORM calls ``eval()``. Counter-checks: the two BatchNorm regimes give different outputs
here, and a decoder without the 0.5 shift or a continue head without the negation miss.
"""

import json
import re
from pathlib import Path

import numpy as np
import torch

from reverie.models.storm_nets import StormDecoder, StormEncoder, StormHead

GOLDEN = Path(__file__).parent / "data" / "storm1c50658_nets.npz"


def golden() -> tuple[dict[str, np.ndarray], dict]:
    with np.load(GOLDEN) as f:
        data = {k: f[k] for k in f.files}
    return data, json.loads(str(data["meta"]))


def reverie_name(module: str, storm: str) -> str:
    """STORM's parameter name -> reverie's: the encoder's ``backbone.i`` is ``layers.i``; the decoder's
    ``backbone.0`` (its Linear) is ``linear`` and ``backbone.i`` (after the Rearrange at 1) ``layers.(i - 2)``; a
    head's ``backbone.i`` is ``hidden.i`` and its ``head`` (or ``head.0``) ``out``."""
    if module == "encoder":
        return storm.replace("backbone.", "layers.")
    if module == "decoder":
        i, rest = re.match(r"backbone\.(\d+)\.(.*)", storm).groups()
        return f"linear.{rest}" if i == "0" else f"layers.{int(i) - 2}.{rest}"
    return re.sub(r"^head(\.0)?\.", "out.", storm.replace("backbone.", "hidden."))


def build(meta: dict) -> dict[str, torch.nn.Module]:
    shape = (meta["channels"], 64, 64)
    return {"encoder": StormEncoder(shape, stem=meta["stem"]),
            "decoder": StormDecoder(meta["z"], shape, stem=meta["stem"]),
            "reward": StormHead(meta["h"], 255), "termination": StormHead(meta["h"], 1, negate=True)}


def loss_weights(shape) -> torch.Tensor:
    n = int(np.prod(shape))
    return torch.cos(0.7 * torch.arange(n, dtype=torch.float64)).float().view(shape)


def storm_space(name: str, y: torch.Tensor) -> torch.Tensor:
    """reverie's output in STORM's terms: the decoder's plus 0.5, the continue logit ``(..., 1)`` negated and
    squeezed (STORM's termination logit is ``(B, L)``)."""
    return y + 0.5 if name == "decoder" else -y.squeeze(-1) if name == "termination" else y


def close(got: torch.Tensor, want: np.ndarray, what: str, rel: float = 1e-5) -> None:
    want = torch.as_tensor(want)
    err = (got.detach().double() - want.double()).abs().max().item()
    assert err <= rel * max(want.abs().max().item(), 1.0), f"{what}: largest difference {err:.3g}"


def test_storm_nets_give_storms_outputs_gradients_and_running_statistics():
    data, meta = golden()
    for name, module in build(meta).items():
        init = {reverie_name(name, k[len(f"{name}/init/"):]): torch.as_tensor(v) for k, v in data.items()
                if k.startswith(f"{name}/init/")}
        assert module.load_state_dict(init, strict=True) is not None
        x = torch.as_tensor(data[f"{name}/input"])
        if x.is_floating_point():
            x.requires_grad_()
        module.train()
        y = storm_space(name, module(x))
        close(y, data[f"{name}/train_out"], f"{name} output (batch statistics)")
        (y * loss_weights(y.shape)).sum().backward()
        for key in [k for k in data if k.startswith(f"{name}/grad/")]:
            param = dict(module.named_parameters())[reverie_name(name, key[len(f"{name}/grad/"):])]
            close(param.grad, data[key], f"{name} gradient {key}")
        if x.is_floating_point():
            close(x.grad, data[f"{name}/input_grad"], f"{name} input gradient")
        buffers = dict(module.named_buffers())
        for key in [k for k in data if k.startswith(f"{name}/after/")]:
            close(buffers[reverie_name(name, key[len(f"{name}/after/"):])], data[key], f"{name} {key}")
        with torch.no_grad():  # acting / imagination: the running statistics, in training mode too
            close(storm_space(name, module(x.detach())), data[f"{name}/eval_out"], f"{name} output (running stats)")


def test_counter_checks():
    data, meta = golden()
    for name in ("encoder", "decoder"):  # the two BatchNorm regimes differ: the eval check can tell them apart
        diff = np.abs(data[f"{name}/train_out"] - data[f"{name}/eval_out"]).max()
        assert diff > 1e-2 * np.abs(data[f"{name}/train_out"]).max(), name
    modules = build(meta)
    for name in ("decoder", "termination"):
        module = modules[name]
        init = {reverie_name(name, k[len(f"{name}/init/"):]): torch.as_tensor(v) for k, v in data.items()
                if k.startswith(f"{name}/init/")}
        module.load_state_dict(init)
        module.train()
        y = module(torch.as_tensor(data[f"{name}/input"])).detach()  # without storm_space: no shift, no negation
        want = torch.as_tensor(data[f"{name}/train_out"])
        y = y.squeeze(-1) if name == "termination" else y
        assert (y - want).abs().max() > 0.5 * want.abs().max().clamp(max=1.0), name
