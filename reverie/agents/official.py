"""The official DreamerV3 code's parameters in reverie's agents, and back: the parameter map.

The current official code (danijar/dreamerv3 at e3f0224) names its parameters by module path, e.g.
``dyn/dynin0/kernel`` or ``pol/head/action/mean/bias``, with ``(in, out)`` dense kernels; reverie's
:class:`reverie.agents.DreamerV3_2025` holds the same layers as torch modules with ``(out, in)`` weights.
:func:`official_map_2025` lists, for a reverie agent, every official name with its reverie state-dict key and the
transform between them; :func:`load_official_2025` puts an official parameter dict into the agent and
:func:`export_official_2025` makes one from it. Where the layouts differ:

- dense kernels are transposed (official ``x @ kernel``, torch ``x @ weight.T``); block-linear kernels
  ``(G, in/G, out/G)`` and every bias and norm scale are copied as they are;
- the vector decoder's first layer reads ``cat(stoch, deter)`` officially (``rssm.py`` ``Decoder``) and
  ``cat(deter, stoch)`` in reverie (the features every head reads): its input rows are reordered;
- per-key decoder outputs (``dec/vec/<key>/pred``) and the policy's mean and std (``pol/head/action/mean``,
  ``.../stddev``) are separate layers on both sides, in reverie in the order of the sorted keys;
- the slow value (``slowval``) is the slow critic; the return normaliser's ``retnorm/lo``, ``retnorm/hi`` are
  :class:`reverie.agents.returns.ReturnNormalizer`'s ``low``, ``high``.

- images: conv kernels ``(k, k, in, out)`` become ``(out, in, k, k)``; the official code flattens its last
  feature map ``(h, w, C)`` and reverie ``(C, h, w)``, so the rows of the posterior's first layer that read the
  image tokens and the outputs of the image decoder's ``sp2`` layer are permuted; the official tokens are
  ``cat(vector, image)`` and reverie's ``cat(image, vector)``.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

Transform = Callable[[np.ndarray], np.ndarray]


def _copy(x: np.ndarray) -> np.ndarray:
    return x


def _transpose(x: np.ndarray) -> np.ndarray:
    return x.T


def _conv(x: np.ndarray) -> np.ndarray:
    return x.transpose(3, 2, 0, 1)  # (k, k, in, out) -> (out, in, k, k)


def _hwc_to_chw(shape: tuple[int, int, int]) -> np.ndarray:
    """``perm`` with ``reverie[r] = official[perm[r]]`` for a map ``(C, h, w)`` flattened as ``(h, w, C)``
    officially and as ``(C, h, w)`` in reverie."""
    c, h, w = shape
    return np.arange(c * h * w).reshape(h, w, c).transpose(2, 0, 1).reshape(-1)


def _conv_stack(entries: dict, official: str, reverie: str, layers, names: list[str]) -> None:
    """The convolutions of ``layers`` (an ``nn.Sequential``) in order, each with its channel norm (the next module
    with a weight before the next convolution, if any), as the official ``<official>/<name>`` and
    ``<official>/<name>norm``."""
    convs = [i for i, m in enumerate(layers) if isinstance(m, torch.nn.Conv2d)]
    for i, name in zip(convs, names, strict=True):
        entries[f"{official}/{name}/kernel"] = (f"{reverie}.{i}.weight", _conv)
        entries[f"{official}/{name}/bias"] = (f"{reverie}.{i}.bias", _copy)
        for j in range(i + 1, len(layers)):  # the conv's norm: the next module with a weight, before the next conv
            if isinstance(layers[j], torch.nn.Conv2d):
                break
            if getattr(layers[j], "weight", None) is not None:
                entries[f"{official}/{name}norm/scale"] = (f"{reverie}.{j}.weight", _copy)
                break


def _mlp(entries: dict, official: str, reverie: str, layers: int, linear: str = "linear{i}",
         norm: str = "norm{i}", first: Transform = _transpose) -> None:
    """An official ``nn.MLP`` (``<official>/linear{i}``, ``<official>/norm{i}``) or ``Encoder``/``RSSM`` stack
    as reverie's :class:`reverie.models.rms_mlp.RMSMLP` hidden layers ``<reverie>.hidden.{i}``."""
    for i in range(layers):
        entries[f"{official}/{linear.format(i=i)}/kernel"] = (f"{reverie}.hidden.{i}.0.weight",
                                                             first if i == 0 else _transpose)
        entries[f"{official}/{linear.format(i=i)}/bias"] = (f"{reverie}.hidden.{i}.0.bias", _copy)
        entries[f"{official}/{norm.format(i=i)}/scale"] = (f"{reverie}.hidden.{i}.1.weight", _copy)


def _dense(entries: dict, official: str, reverie: str, transform: Transform = _transpose) -> None:
    entries[f"{official}/kernel"] = (f"{reverie}.weight", transform)
    entries[f"{official}/bias"] = (f"{reverie}.bias", _copy)


def official_map_2025(agent) -> dict[str, tuple[str, Transform]]:
    """``{official name: (reverie state-dict key, official -> reverie transform)}`` for a
    :class:`reverie.agents.DreamerV3_2025` with the official model (the block RSSM, reconstruction) on vector and
    image observations.

    Raises:
        NotImplementedError: another dynamics or representation objective, or an image decoder without ``bspace``.
    """
    wm = agent.wm
    if type(wm.dynamics).__name__ != "BlockRSSM" or wm.representation.name != "reconstruction":
        raise NotImplementedError("official_map_2025: only the official model maps (BlockRSSM dynamics, "
                                  "representation=reconstruction)")
    dyn = wm.dynamics
    deter, stoch = dyn.deter, dyn.stoch * dyn.classes
    entries: dict[str, tuple[str, Transform]] = {}
    vector_tokens = image_tokens = 0
    if wm.encoder is not None:
        _mlp(entries, "enc", "wm.encoder", len(wm.encoder.hidden), linear="mlp{i}", norm="mlp{i}norm")
        vector_tokens = wm.encoder.out_dim
    if wm.image_encoder is not None:
        encoder = wm.image_encoder
        _conv_stack(entries, "enc", "wm.image_encoder.layers", encoder.layers,
                    [f"cnn{i}" for i in range(len(encoder.channels))])
        image_tokens = encoder.out_dim
        token_perm = _hwc_to_chw(encoder.out_shape)

    def posterior_input(kernel: np.ndarray) -> np.ndarray:  # rows (deter, vector, image hwc) -> (deter, image chw,
        if not image_tokens:                                 # vector), as the weight (out, in)
            return kernel.T
        vector = kernel[deter:deter + vector_tokens]
        image = kernel[deter + vector_tokens:][token_perm]
        return np.concatenate([kernel[:deter], image, vector], 0).T
    for i, name in enumerate(("in_deter", "in_stoch", "in_action")):
        _dense(entries, f"dyn/dynin{i}", f"wm.dynamics.core.{name}.0")
        entries[f"dyn/dynin{i}norm/scale"] = (f"wm.dynamics.core.{name}.1.weight", _copy)
    for i in range(len(dyn.core.hidden) // 3):  # (BlockLinear, RMSNorm, SiLU) per dynlayer
        _dense(entries, f"dyn/dynhid{i}", f"wm.dynamics.core.hidden.{3 * i}", _copy)
        entries[f"dyn/dynhid{i}norm/scale"] = (f"wm.dynamics.core.hidden.{3 * i + 1}.weight", _copy)
    _dense(entries, "dyn/dyngru", "wm.dynamics.core.gates", _copy)
    _mlp(entries, "dyn", "wm.dynamics.prior_net", len(dyn.prior_net.hidden), linear="prior{i}", norm="prior{i}norm")
    _dense(entries, "dyn/priorlogit", "wm.dynamics.prior_net.out")
    _mlp(entries, "dyn", "wm.dynamics.post_net", len(dyn.post_net.hidden), linear="obs{i}", norm="obs{i}norm",
         first=posterior_input)
    _dense(entries, "dyn/obslogit", "wm.dynamics.post_net.out")

    def decoder_input(kernel: np.ndarray) -> np.ndarray:  # rows (stoch, deter) -> weight over (deter, stoch)
        return np.concatenate([kernel[stoch:], kernel[:stoch]], 0).T

    decoder = wm.representation.decoder
    if decoder is not None:
        _mlp(entries, "dec/mlp", "wm.representation.decoder", len(decoder.hidden), first=decoder_input)
        for j, key in enumerate(wm.vector_keys):
            _dense(entries, f"dec/vec/{key}/pred", f"wm.representation.decoder.out.parts.{j}")
    image_decoder = wm.representation.image_decoder
    if image_decoder is not None:
        name = "wm.representation.image_decoder"
        if not image_decoder.bspace:
            raise NotImplementedError("official_map_2025: the image decoder without bspace is not mapped")
        map_perm = _hwc_to_chw(image_decoder.map_shape)
        _dense(entries, "dec/sp0", f"{name}.space_deter", _copy)
        _dense(entries, "dec/sp1", f"{name}.space_stoch.0.0")
        entries["dec/sp1norm/scale"] = (f"{name}.space_stoch.0.1.weight", _copy)
        entries["dec/sp2/kernel"] = (f"{name}.space_stoch.1.weight", lambda k: k.T[map_perm])
        entries["dec/sp2/bias"] = (f"{name}.space_stoch.1.bias", lambda b: b[map_perm])
        entries["dec/spnorm/scale"] = (f"{name}.space_norm.0.weight", _copy)
        convs = sum(isinstance(m, torch.nn.Conv2d) for m in image_decoder.layers)
        _conv_stack(entries, "dec", f"{name}.layers", image_decoder.layers,
                    [f"conv{i}" for i in reversed(range(convs - 1))] + ["imgout"])
    for official, reverie, out in (("rew", "wm.reward_head", "logits"), ("con", "wm.cont_head", "logit"),
                                   ("val", "critic", "logits"), ("slowval", "slow_critic", "logits")):
        module = agent.get_submodule(reverie)
        _mlp(entries, f"{official}/mlp", reverie, len(module.hidden))
        _dense(entries, f"{official}/head/{out}", f"{reverie}.out")
    _mlp(entries, "pol/mlp", "actor.net", len(agent.actor.net.hidden))
    if agent.spec.discrete:
        _dense(entries, "pol/head/action/logits", "actor.net.out")
    else:
        _dense(entries, "pol/head/action/mean", "actor.net.out.parts.0")
        _dense(entries, "pol/head/action/stddev", "actor.net.out.parts.1")
    entries["retnorm/lo/value"] = ("retnorm.low", _copy)
    entries["retnorm/hi/value"] = ("retnorm.high", _copy)
    return entries


def load_official_2025(agent, params: dict[str, np.ndarray]) -> None:
    """Copy an official parameter dict (``{name: array}``, e.g. ``embodied.jax.Agent.params`` without its
    ``opt/`` entries) into ``agent`` in place.

    Raises:
        KeyError: an official parameter the map lacks, or one the map needs that ``params`` lacks (the first
            such name, with what to do).
        ValueError: a shape that does not fit (the official name, both shapes).
    """
    entries = official_map_2025(agent)
    model = {k: v for k, v in params.items() if not k.startswith("opt/") and not k.endswith("_count/value")}
    unknown = sorted(model.keys() - entries.keys())
    if unknown:
        raise KeyError(f"load_official_2025: the official parameter {unknown[0]!r} has no place in this "
                       f"{type(agent).__name__} ({len(unknown)} unmapped); build the agent with the official "
                       f"run's sizes and observation keys")
    missing = sorted(entries.keys() - model.keys())
    if missing:
        raise KeyError(f"load_official_2025: the official parameters lack {missing[0]!r} ({len(missing)} missing); "
                       f"pass every non-optimiser parameter of the official agent")
    state = dict(agent.named_parameters()) | dict(agent.named_buffers())
    with torch.no_grad():
        for name, (key, transform) in entries.items():
            target = state[key]
            value = np.asarray(transform(np.asarray(model[name])))
            if tuple(value.shape) != tuple(target.shape):
                raise ValueError(f"load_official_2025: {name!r} of shape {np.asarray(model[name]).shape} becomes "
                                 f"{value.shape}, but reverie's {key!r} is {tuple(target.shape)}; build the agent "
                                 f"with the official run's sizes")
            target.copy_(torch.as_tensor(value.copy(), dtype=target.dtype))


def reverie_value(agent, name: str, official_value: np.ndarray) -> torch.Tensor:
    """The official array ``official_value`` of parameter ``name`` in reverie's layout (for comparisons)."""
    key, transform = official_map_2025(agent)[name]
    return torch.as_tensor(np.array(transform(np.asarray(official_value))))
