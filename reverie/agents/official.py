"""The official DreamerV3 code's parameters in reverie's agents, and back: the parameter map.

The official code names its parameters by module path (2025, e3f0224: ``dyn/dynin0/kernel``; 2023, 8fa35f8:
``agent/wm/rssm/img_in/kernel``) with ``(in, out)`` dense kernels; reverie's :class:`reverie.agents.DreamerV3_2025`
and :class:`reverie.agents.DreamerV3` hold the same layers as torch modules. :func:`official_map` pairs the names with
transforms, :func:`load_official` and :func:`to_official` copy either way, :func:`read_official_checkpoint` reads a
checkpoint (``reverie import-official``). docs/fidelity.md lists where the layouts differ."""

from __future__ import annotations

import pickle
from pathlib import Path
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


def _conv_transpose(x: np.ndarray) -> np.ndarray:
    """A 2023 transposed-conv kernel ``(k, k, out, in)`` (not flipped) as ``ConvTranspose2d``'s ``(in, out, k, k)``."""
    return x[::-1, ::-1].transpose(3, 2, 0, 1)


def _hwc_to_chw(shape: tuple[int, int, int]) -> np.ndarray:
    """``perm``, ``reverie[r] = official[perm[r]]``, for a ``(C, h, w)`` map flattened officially as ``(h, w, C)``."""
    c, h, w = shape
    return np.arange(c * h * w).reshape(h, w, c).transpose(2, 0, 1).reshape(-1)


def _conv_stack(entries: dict, official: str, reverie: str, layers, names: list[str]) -> None:
    """The convolutions of ``layers`` and their channel norms as the official ``<official>/<name>``, ``<name>norm``."""
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
    """An official ``nn.MLP``/``Encoder``/``RSSM`` stack as :class:`reverie.models.rms_mlp.RMSMLP` hidden layers."""
    for i in range(layers):
        entries[f"{official}/{linear.format(i=i)}/kernel"] = (f"{reverie}.hidden.{i}.0.weight",
                                                             first if i == 0 else _transpose)
        entries[f"{official}/{linear.format(i=i)}/bias"] = (f"{reverie}.hidden.{i}.0.bias", _copy)
        entries[f"{official}/{norm.format(i=i)}/scale"] = (f"{reverie}.hidden.{i}.1.weight", _copy)


def _dense(entries: dict, official: str, reverie: str, transform: Transform = _transpose) -> None:
    entries[f"{official}/kernel"] = (f"{reverie}.weight", transform)
    entries[f"{official}/bias"] = (f"{reverie}.bias", _copy)


Layout = dict[str, list[tuple[str, int]]]  # reverie vector key -> [(official key, width), ...] in reverie's order


def _layout(agent, layout: Layout | None) -> Layout:
    """The vector layout: ``layout``, or each reverie vector key as itself (its own width)."""
    wm = agent.wm
    return layout or {k: [(k, wm.obs_shapes[k][0])] for k in wm.vector_keys}


def _rows(order: list[tuple[str, int]], want: list[tuple[str, int]]) -> np.ndarray:
    """Row indices that take a concatenation in ``order`` to one in ``want`` (both ``[(key, width)]``)."""
    start, offset = {}, 0
    for key, width in order:
        start[key], offset = offset, offset + width
    return np.concatenate([np.arange(start[k], start[k] + w) for k, w in want]).astype(np.int64)


def _official_model(agent, dynamics: str, owner: str) -> tuple:
    """``(wm, dynamics, D, S*K)``; NotImplementedError unless the dynamics class is ``dynamics``, reconstruction."""
    wm = agent.wm
    # the readable class (kernels=auto swaps in a subclass computing the same, with the same parameters)
    readable = next(c for c in type(wm.dynamics).__mro__ if not c.__module__.startswith("reverie.models.kernels"))
    if readable.__name__ != dynamics or wm.representation.name != "reconstruction":
        raise NotImplementedError(f"{owner}: only the official model maps ({dynamics} dynamics, "
                                  f"representation=reconstruction)")
    dyn = wm.dynamics
    return wm, dyn, dyn.deter, dyn.stoch * dyn.classes


def official_map_2025(agent, layout: Layout | None = None) -> dict[str, tuple[str, Transform]]:
    """``{official name: (reverie state-dict key, official -> reverie transform)}`` for a
    :class:`reverie.agents.DreamerV3_2025` with the official model on vector and image observations. ``layout``: the
    official vector keys each reverie key concatenates (None: the same keys). NotImplementedError for another model."""
    wm, dyn, deter, stoch = _official_model(agent, "BlockRSSM", "official_map_2025")
    entries: dict[str, tuple[str, Transform]] = {}
    vector_tokens = image_tokens = 0
    if wm.encoder is not None:
        vectors = [item for key in wm.vector_keys for item in _layout(agent, layout)[key]]  # reverie's input order
        encoder_rows = _rows(sorted(vectors), vectors)  # the official DictConcat sorts its keys
        _mlp(entries, "enc", "wm.encoder", len(wm.encoder.hidden), linear="mlp{i}", norm="mlp{i}norm",
             first=lambda k: k[encoder_rows].T)
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

    def decoder_input(kernel: np.ndarray) -> np.ndarray:  # rows (stoch, deter) (rssm.py Decoder) -> (deter, stoch)
        return np.concatenate([kernel[stoch:], kernel[:stoch]], 0).T

    decoder = wm.representation.decoder
    if decoder is not None:
        _mlp(entries, "dec/mlp", "wm.representation.decoder", len(decoder.hidden), first=decoder_input)
        for j, key in enumerate(wm.vector_keys):
            parts = [f"dec/vec/{name}/pred" for name, _ in _layout(agent, layout)[key]]
            if len(parts) == 1:
                _dense(entries, parts[0], f"wm.representation.decoder.out.parts.{j}")
            else:
                entries[f"dec/vec/*{j}/kernel"] = (f"wm.representation.decoder.out.parts.{j}.weight", parts)
                entries[f"dec/vec/*{j}/bias"] = (f"wm.representation.decoder.out.parts.{j}.bias", parts)
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
    for official, reverie, out in (("rew", "wm.reward_head", "head/logits"), ("con", "wm.cont_head", "head/logit"),
                                   ("val", "critic", "head/logits"), ("slowval", "slow_critic", "head/logits")):
        module = agent.get_submodule(reverie)
        _mlp(entries, f"{official}/mlp", reverie, len(module.hidden))
        _dense(entries, f"{official}/{out}", f"{reverie}.out")
    _mlp(entries, "pol/mlp", "actor.net", len(agent.actor.net.hidden))
    if agent.spec.discrete:
        _dense(entries, "pol/head/action/logits", "actor.net.out")
    else:
        _dense(entries, "pol/head/action/mean", "actor.net.out.parts.0")
        _dense(entries, "pol/head/action/stddev", "actor.net.out.parts.1")
    entries["retnorm/lo/value"] = ("retnorm.low", _copy)
    entries["retnorm/hi/value"] = ("retnorm.high", _copy)
    return entries


def _mlp_2023(entries: dict, official: str, reverie: str, layers: int, first: Transform = _transpose) -> None:
    """A 2023 ``nets.MLP`` trunk (``h{i}/kernel`` without bias, LayerNorm ``h{i}/norm``) as ``<reverie>.hidden.{i}``."""
    for i in range(layers):
        entries[f"{official}/h{i}/kernel"] = (f"{reverie}.hidden.{i}.0.weight", first if i == 0 else _transpose)
        entries[f"{official}/h{i}/norm/scale"] = (f"{reverie}.hidden.{i}.1.weight", _copy)
        entries[f"{official}/h{i}/norm/bias"] = (f"{reverie}.hidden.{i}.1.bias", _copy)


def official_map_2023(agent, layout: Layout | None = None) -> dict[str, tuple[str, Transform]]:
    """``{official name: (reverie key, transform)}`` for a :class:`reverie.agents.DreamerV3` with the 2023 model
    (:class:`reverie.models.dynamics.CategoricalRSSM`, reconstruction) against 8fa35f8's ``agent/...`` names; ``layout``
    as for :func:`official_map_2025`. NotImplementedError for another model."""
    wm, dyn, deter, stoch = _official_model(agent, "CategoricalRSSM", "official_map_2023")
    entries: dict[str, tuple[str, Transform]] = {}
    image_tokens = vector_tokens = 0
    if wm.image_encoder is not None:
        convs = [i for i, m in enumerate(wm.image_encoder.layers) if isinstance(m, torch.nn.Conv2d)]
        for n, i in enumerate(convs):  # s{n}res: Conv2d (no bias), ChannelNorm
            entries[f"agent/wm/enc/cnn/s{n}res/kernel"] = (f"wm.image_encoder.layers.{i}.weight", _conv)
            entries[f"agent/wm/enc/cnn/s{n}res/norm/scale"] = (f"wm.image_encoder.layers.{i + 1}.weight", _copy)
            entries[f"agent/wm/enc/cnn/s{n}res/norm/bias"] = (f"wm.image_encoder.layers.{i + 1}.bias", _copy)
        image_tokens = wm.image_encoder.out_dim
        channels = wm.image_encoder.layers[convs[-1]].out_channels
        side = int(round((image_tokens // channels) ** 0.5))
        token_perm = _hwc_to_chw((channels, side, side))
    if wm.encoder is not None:
        _mlp_2023(entries, "agent/wm/enc/mlp", "wm.encoder", len(wm.encoder.hidden))
        vector_tokens = wm.encoder.out_dim

    def embed_rows(kernel: np.ndarray) -> np.ndarray:  # obs_out's embed rows (image hwc, vector) -> (image chw,
        rows = kernel[deter:]                            # vector), as the weight (out, in)
        if image_tokens:
            rows = np.concatenate([rows[:image_tokens][token_perm], rows[image_tokens:]], 0)
        return rows.T

    r = "agent/wm/rssm"
    entries[f"{r}/initial"] = ("wm.dynamics.initial_deter", _copy)
    entries[f"{r}/img_in/kernel"] = ("wm.dynamics.in_z.weight", lambda k: k[:stoch].T)  # rows (stoch, action)
    entries[f"{r}/img_in/kernel@action"] = ("wm.dynamics.in_a.weight", lambda k: k[stoch:].T)
    entries[f"{r}/img_in/norm/scale"] = ("wm.dynamics.in_norm.0.weight", _copy)
    entries[f"{r}/img_in/norm/bias"] = ("wm.dynamics.in_norm.0.bias", _copy)
    entries[f"{r}/gru/kernel"] = ("wm.dynamics.gru.linear.weight",
                                  lambda k: np.concatenate([k[deter:], k[:deter]], 0).T)  # (deter, x) -> (x, deter)
    entries[f"{r}/gru/norm/scale"] = ("wm.dynamics.gru.norm.weight", _copy)
    entries[f"{r}/gru/norm/bias"] = ("wm.dynamics.gru.norm.bias", _copy)
    entries[f"{r}/img_out/kernel"] = ("wm.dynamics.prior_net.hidden.0.0.weight", _transpose)
    entries[f"{r}/img_out/norm/scale"] = ("wm.dynamics.prior_net.hidden.0.1.weight", _copy)
    entries[f"{r}/img_out/norm/bias"] = ("wm.dynamics.prior_net.hidden.0.1.bias", _copy)
    _dense(entries, f"{r}/img_stats", "wm.dynamics.prior_net.out")
    entries[f"{r}/obs_out/kernel"] = ("wm.dynamics.post_h.weight", lambda k: k[:deter].T)  # rows (deter, embed)
    entries[f"{r}/obs_out/kernel@embed"] = ("wm.dynamics.post_e.weight", embed_rows)
    entries[f"{r}/obs_out/norm/scale"] = ("wm.dynamics.post_norm.0.weight", _copy)
    entries[f"{r}/obs_out/norm/bias"] = ("wm.dynamics.post_norm.0.bias", _copy)
    _dense(entries, f"{r}/obs_stats", "wm.dynamics.post_out")
    decoder = wm.representation.decoder
    if decoder is not None:
        _mlp_2023(entries, "agent/wm/dec/mlp", "wm.representation.decoder", len(decoder.hidden))
        keys = [f"agent/wm/dec/mlp/dist_{name}/out" for k in wm.vector_keys for name, _ in _layout(agent, layout)[k]]
        entries["agent/wm/dec/mlp/*/out/kernel"] = ("wm.representation.decoder.out.weight", keys)
        entries["agent/wm/dec/mlp/*/out/bias"] = ("wm.representation.decoder.out.bias", keys)
    image_decoder = wm.representation.image_decoder
    if image_decoder is not None:
        name = "wm.representation.image_decoder"
        map_perm = _hwc_to_chw(image_decoder.in_shape)
        entries["agent/wm/dec/cnn/in/kernel"] = (f"{name}.linear.weight", lambda k: k.T[map_perm])
        entries["agent/wm/dec/cnn/in/bias"] = (f"{name}.linear.bias", lambda b: b[map_perm])
        convs = [i for i, m in enumerate(image_decoder.layers) if isinstance(m, torch.nn.ConvTranspose2d)]
        for n, i in enumerate(convs):  # s{n}res: ConvTranspose2d, ChannelNorm (the last: bias, no norm)
            entries[f"agent/wm/dec/cnn/s{n}res/kernel"] = (f"{name}.layers.{i}.weight", _conv_transpose)
            if n == len(convs) - 1:
                entries[f"agent/wm/dec/cnn/s{n}res/bias"] = (f"{name}.layers.{i}.bias", _copy)
            else:
                entries[f"agent/wm/dec/cnn/s{n}res/norm/scale"] = (f"{name}.layers.{i + 1}.weight", _copy)
                entries[f"agent/wm/dec/cnn/s{n}res/norm/bias"] = (f"{name}.layers.{i + 1}.bias", _copy)
    for official, reverie in (("agent/wm/rew", "wm.reward_head"), ("agent/wm/cont", "wm.cont_head"),
                              ("agent/task_behavior/critic/net", "critic"),
                              ("agent/task_behavior/critic/slow", "slow_critic"),
                              ("agent/task_behavior/ac/actor", "actor.net")):
        _mlp_2023(entries, official, reverie, len(agent.get_submodule(reverie).hidden))
        if reverie == "actor.net" and not agent.spec.discrete:
            parts = [f"{official}/dist_out/out", f"{official}/dist_out/std"]
            entries[f"{official}/*/kernel"] = (f"{reverie}.out.weight", parts)
            entries[f"{official}/*/bias"] = (f"{reverie}.out.bias", parts)
        else:
            _dense(entries, f"{official}/dist_out/out", f"{reverie}.out")
    entries["agent/task_behavior/ac/retnorm_extr/low/value"] = ("retnorm.low", _copy)
    entries["agent/task_behavior/ac/retnorm_extr/high/value"] = ("retnorm.high", _copy)
    return entries


def official_map(agent, layout: Layout | None = None) -> dict[str, tuple[str, Transform | list[str]]]:
    """The parameter map of ``agent``'s official version (:func:`official_map_2025` or :func:`official_map_2023`):
    ``{official name: (reverie key, transform)}``; a name with ``@`` reads the official array before the ``@`` (one
    official kernel over two reverie layers); a name with ``*`` concatenates the official arrays listed in place of the
    transform along the outputs (one reverie layer over several official ones)."""
    if type(agent).__name__ == "DreamerV3_2025":
        return official_map_2025(agent, layout)
    return official_map_2023(agent, layout)


def to_reverie(agent, params: dict[str, np.ndarray], layout: Layout | None = None) -> dict[str, np.ndarray]:
    """Official arrays by name -> reverie's layout by key, for the :func:`official_map` entries ``params`` holds."""
    out = {}
    for name, (key, how) in official_map(agent, layout).items():
        sources = _sources(name, how)
        if not all(source in params for source in sources):
            continue
        arrays = [np.asarray(params[source]) for source in sources]
        if "*" in name:  # one reverie layer over several official ones, concatenated along the outputs
            out[key] = np.concatenate([a.T if a.ndim == 2 else a for a in arrays], 0)
        else:
            out[key] = np.asarray(how(arrays[0]))
    return out


def _sources(name: str, how: Transform | list[str]) -> list[str]:
    """The official arrays one entry of :func:`official_map` reads."""
    if "*" in name:
        return [f"{p}/{name.rsplit('/', 1)[1]}" for p in how]
    return [name.split("@")[0]]


def official_names(agent, layout: Layout | None = None) -> set[str]:
    """The official parameter names :func:`official_map` reads."""
    return {source for name, (_, how) in official_map(agent, layout).items() for source in _sources(name, how)}


def to_official(agent, template: dict[str, np.ndarray], layout: Layout | None = None) -> dict[str, np.ndarray]:
    """The agent's parameters in the official layout, by official name (inverse of :func:`load_official`); ``template``,
    an official parameter dict of the same configuration, gives the shapes and dtypes. Raises KeyError when
    ``template`` lacks a parameter the map needs."""
    names = sorted(official_names(agent, layout))
    missing = [n for n in names if n not in template]
    if missing:
        raise KeyError(f"to_official: the template lacks {missing[0]!r}")
    sizes = [int(np.prod(np.shape(template[n]))) for n in names]
    starts = np.cumsum([0] + sizes)[:-1]
    positions = {n: np.arange(start, start + size, dtype=np.int64).reshape(np.shape(template[n]))
                 for n, start, size in zip(names, starts, sizes)}  # every official entry's place in one buffer
    state = dict(agent.named_parameters()) | dict(agent.named_buffers())
    flat = np.zeros(sum(sizes), np.float64)
    for key, index in to_reverie(agent, positions, layout).items():
        flat[index.ravel()] = state[key].detach().cpu().double().numpy().ravel()
    return {n: flat[start:start + size].reshape(np.shape(template[n])).astype(np.asarray(template[n]).dtype)
            for n, start, size in zip(names, starts, sizes)}


def load_official(agent, params: dict[str, np.ndarray], layout: Layout | None = None) -> None:
    """Copy an official parameter dict (2025 ``embodied.jax.Agent.params`` or 2023 ``JAXAgent.varibs``; optimiser
    states and counters are skipped) into ``agent`` in place; ``layout`` e.g. :func:`dmc_layout`. Raises KeyError for
    an official parameter the map lacks or a needed one ``params`` lacks, ValueError for a shape that does not fit
    (each naming the first such key)."""
    needed = official_names(agent, layout)
    ignored = ("opt/", "_opt/", "_count/value", "/updates/value", "/step")
    model = {k: v for k, v in params.items() if not any(x in k or k.endswith(x) for x in ignored)}
    unknown = sorted(model.keys() - needed)
    if unknown:
        raise KeyError(f"load_official: the official parameter {unknown[0]!r} has no place in this "
                       f"{type(agent).__name__} ({len(unknown)} unmapped); build the agent with the official "
                       f"run's sizes and observation keys")
    missing = sorted(needed - model.keys())
    if missing:
        raise KeyError(f"load_official: the official parameters lack {missing[0]!r} ({len(missing)} missing); "
                       f"pass every non-optimiser parameter of the official agent")
    state = dict(agent.named_parameters()) | dict(agent.named_buffers())
    with torch.no_grad():
        for key, value in to_reverie(agent, model, layout).items():
            target = state[key]
            if tuple(value.shape) != tuple(target.shape):
                raise ValueError(f"load_official: the official array for reverie's {key!r} has shape "
                                 f"{value.shape} in reverie's layout, but {key!r} is {tuple(target.shape)}; build "
                                 f"the agent with the official run's sizes")
            target.copy_(torch.as_tensor(value.copy(), dtype=target.dtype))


class _ArraysOnly(pickle.Unpickler):
    """Unpickles numpy arrays and plain containers only; other classes become inert tuples, no code runs."""

    SAFE = {("builtins", n) for n in ("dict", "list", "tuple", "set", "frozenset", "int", "float", "complex", "str",
                                      "bytes", "bool", "slice", "range")}

    def find_class(self, module: str, name: str):
        if module.split(".")[0] == "numpy" or (module, name) in self.SAFE or \
                (module, name) in {("collections", "OrderedDict"), ("copyreg", "_reconstructor")}:
            return super().find_class(module, name)
        return _Inert


class _Inert(tuple):
    def __new__(cls, *args, **kwargs):
        return tuple.__new__(cls, args)

    def __setstate__(self, state):
        pass


def read_official_checkpoint(path: str | Path) -> tuple[str, dict[str, np.ndarray]]:
    """``(version, parameters by official name)`` of an official checkpoint: the 2025 code's
    ``<logdir>/ckpt/<stamp>/agent.pkl`` (the logdir, ``ckpt`` or stamp folder) or the 2023 ``checkpoint.ckpt`` (file or
    logdir); only numpy arrays are unpickled. Raises FileNotFoundError when there is none, ValueError when it holds no
    agent parameters."""
    path = Path(path).expanduser()
    if path.is_dir():
        if (path / "checkpoint.ckpt").is_file():
            path = path / "checkpoint.ckpt"
        else:
            if (path / "ckpt").is_dir():
                path = path / "ckpt"
            if (path / "latest").is_file():
                path = path / (path / "latest").read_text().strip()
    if path.is_file():  # 2023: one pickle {'agent': varibs, 'step': ..., ...}
        with open(path, "rb") as f:
            data = _ArraysOnly(f).load()
        agent = data.get("agent") if isinstance(data, dict) else None
        if not isinstance(agent, dict):
            raise ValueError(f"{path}: no 'agent' parameters in this checkpoint (an official 2023 checkpoint.ckpt "
                             f"holds them)")
        return "2023", {k: np.asarray(v) for k, v in agent.items() if isinstance(v, np.ndarray)}
    files = sorted(path.glob("agent-*.pkl")) if path.is_dir() else []
    if path.is_dir() and (path / "agent.pkl").is_file():
        files = [path / "agent.pkl"]
    if not files:
        raise FileNotFoundError(f"{path}: no official DreamerV3 checkpoint (looked for the 2025 code's "
                                f"ckpt/<stamp>/agent.pkl and the 2023 code's checkpoint.ckpt)")
    params: dict[str, np.ndarray] = {}
    for file in files:  # a sharded save writes agent-0000.pkl, agent-0001.pkl, ... each a part of the dict
        with open(file, "rb") as f:
            data = _ArraysOnly(f).load()
        params |= {k: np.asarray(v) for k, v in data.get("params", {}).items()}
    if not params:
        raise ValueError(f"{path}: no 'params' in {files[0].name}")
    return "2025", params


def dmc_layout(params: dict[str, np.ndarray], proprio_keys: list[str], key: str = "vector") -> Layout:
    """The layout of reverie's DMC ``vector`` (``proprio_keys`` in dm_control's order) from an official checkpoint's
    decoder output widths; KeyError for a key without one (another task or env)."""
    widths = {}
    for name, value in params.items():
        for prefix, suffix in (("dec/vec/", "/pred/bias"), ("agent/wm/dec/mlp/dist_", "/out/bias")):
            if name.startswith(prefix) and name.endswith(suffix):
                widths[name[len(prefix):-len(suffix)]] = int(np.asarray(value).shape[-1])
    missing = [k for k in proprio_keys if k not in widths]
    if missing:
        raise KeyError(f"dmc_layout: the official checkpoint has no decoder output for {missing[0]!r} (its vector "
                       f"keys: {sorted(widths)}); was it trained on this DMC task?")
    return {key: [(k, widths[k]) for k in proprio_keys]}
