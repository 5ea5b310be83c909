"""Load a trained run and act with it: ``load_run(path).act(obs, state)``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import OmegaConf

from reverie.state.checkpoint import BEST_FILE, find_checkpoint, list_checkpoints
from reverie.envs import to_env_action


class LoadedRun:
    """A trained agent (eval mode) with its resolved run ``config`` (plain dict), ``obs_shapes``, ``action_spec``
    and ``counters`` (``{"env_steps", "updates"}``, plus ``"eval_return"`` for ``best.pt``)."""

    def __init__(self, agent: Any, config: dict, obs_shapes: dict, action_spec: Any, counters: dict):
        self.agent, self.config, self.obs_shapes, self.action_spec = agent, config, obs_shapes, action_spec
        self.counters = counters
        self.directory: Path | None = None  # the run directory (set by load_run)
        self.checkpoint: Path | None = None  # the checkpoint file loaded
        self.checkpoint_kind = ""  # why that file (load_run's ``checkpoint``): "best: ...", "last", ...

    @property
    def acting(self) -> dict:
        """How the agent acts: ``{"planner": "actor"}`` or ``{"planner": "cem"|"mppi", **settings}`` (DreamerV3,
        :mod:`reverie.agents.dreamer_planning`); ``{}`` for agents without the choice (PlaNet always plans)."""
        from reverie.agents.dreamer_planning import DreamerPlanner

        planner = getattr(self.agent, "planner", False)
        if planner is None:
            return {"planner": "actor"}
        return {"planner": planner.kind, **planner.settings} if isinstance(planner, DreamerPlanner) else {}

    def initial_state(self, batch: int = 1) -> Any:
        return self.agent.initial_state(batch)

    def act(self, obs: dict[str, np.ndarray], state: Any = None, mode: str = "eval") -> tuple[np.ndarray, Any]:
        """Policy step returning actions ready for envs built by :func:`reverie.make_env`/``make_vector_env``.

        ``obs`` is one env's observation dict (e.g. ``{"vector": (F,)}``) or a batch of ``N`` (``(N, F)``);
        without ``is_first`` the episode starts when ``state`` is None. ``mode`` is ``"eval"`` or ``"sample"``.
        Returns ``(action, state)``: an ``int`` (Discrete) or ``(A,)`` float32 in ``[-1, 1]`` (Box) for one env,
        ``(N,)`` int64 or ``(N, A)`` for a batch.
        """
        key = next(iter(self.obs_shapes))
        single = np.asarray(obs[key]).ndim == len(self.obs_shapes[key])
        batch = {k: np.asarray(obs[k])[None] if single else np.asarray(obs[k]) for k in self.obs_shapes}
        n = len(batch[key])
        is_first = obs.get("is_first", np.full(n, state is None))
        batch["is_first"] = np.asarray(is_first, bool).reshape(n)
        action, state = self.agent.act(batch, state, mode)
        env_action = to_env_action(action, self.action_spec)
        return (env_action[0].item() if self.action_spec.discrete else env_action[0]) if single else env_action, state


class RunError(ValueError):
    """A run directory or checkpoint that cannot be loaded; the message names the problem and the fix."""


#: Entries a checkpoint written by ``reverie train`` holds (see ``train.checkpoint``).
CHECKPOINT_KEYS = ("agent", "obs_shapes", "action_spec", "config")

#: Prefix of a wandb artifact reference accepted by :func:`resolve_run`.
WANDB_PREFIX = "wandb:"


def resolve_run(reference: str | Path, cache: str | Path | None = None) -> Path:
    """A run directory, a checkpoint file or a wandb artifact reference -> a local path for :func:`load_run`.

    A wandb reference is ``wandb:<entity>/<project>/<name>:<alias>`` (what ``Logger`` logs with the wandb backend),
    downloaded to ``cache`` (default: wandb's cache). Raises RunError for a missing path or wandb not installed.
    """
    text = str(reference)
    if text.startswith(WANDB_PREFIX):
        try:
            import wandb
        except ImportError as err:
            raise RunError(f"{text} is a wandb artifact reference but wandb is not installed: "
                           f"`pip install reverie[wandb]`, or pass a local run directory") from err
        artifact = wandb.Api().artifact(text[len(WANDB_PREFIX):], type="model")
        return Path(artifact.download(root=None if cache is None else str(cache)))
    path = Path(text)
    if not path.exists():
        raise RunError(f"no checkpoint to load: {text!r} does not exist. Pass a run directory written by "
                       f"`reverie train` (runs/<date>_<time>_<exp>_<agent>_<env>/), a checkpoint file "
                       f"(.../checkpoints/ckpt_*.pt) or wandb:<entity>/<project>/<run id>-checkpoint:latest")
    return path


def run_directory(path: str | Path) -> Path:
    """The run directory of a run directory, its ``checkpoints/`` folder or a checkpoint file in it."""
    path = Path(path)
    if path.is_file():
        path = path.parent
    return path.parent if path.name == "checkpoints" else path


def select_checkpoint(path: str | Path, checkpoint: str = "best") -> tuple[Path, str]:
    """The checkpoint file :func:`load_run` reads, and what it is in words.

    ``path`` is a run directory, its ``checkpoints/`` folder or a file (used as it is); ``checkpoint`` is ``"best"``
    (``best.pt``, else the newest checkpoint), ``"last"`` (the newest ``ckpt_<step>.pt``) or a file path (as given,
    else under ``checkpoints/``). Raises FileNotFoundError when there is no such checkpoint.
    """
    path = Path(path)
    if path.is_file():
        return path, "the file given"
    folder = path / "checkpoints" if (path / "checkpoints").is_dir() else path  # a run dir, or its checkpoints
    if checkpoint not in ("best", "last"):
        for candidate in (Path(checkpoint), folder / checkpoint):
            if candidate.is_file():
                return candidate, "the file given"
        raise FileNotFoundError(f"checkpoint {checkpoint!r}: no such file (nor {folder / checkpoint}); pass best, "
                                f"last or a checkpoint file")
    if checkpoint == "best" and (folder / BEST_FILE).is_file():
        return folder / BEST_FILE, "best: the weights of the best evaluation"
    newest = find_checkpoint(path)
    return newest, ("last" if checkpoint == "last" else
                    "last (the run has no best.pt: no evaluation of a trained policy yet)")


def load_run(path: str | Path, device: str = "cpu", checkpoint: str = "best", planner: str | None = None,
             plan: dict | None = None) -> LoadedRun:
    """Rebuild the agent of a run directory, checkpoint file or wandb reference (:func:`resolve_run`) on ``device``.

    ``checkpoint`` as in :func:`select_checkpoint`; ``planner`` (``"actor"``, ``"cem"``, ``"mppi"``) and ``plan``
    (e.g. ``{"candidates": 500}``) replace a DreamerV3 run's own ``agent.module.planner``/``plan``. Returns a
    :class:`LoadedRun` with ``directory``, ``checkpoint`` and ``checkpoint_kind`` set. Raises RunError for a
    missing path or checkpoint, a corrupt or incomplete checkpoint or one that does not fit its agent (naming older
    checkpoints to try), and the planner errors of :func:`set_planner`.
    """
    from reverie.agents.build import build_agent

    path = resolve_run(path)
    try:
        ckpt, kind = select_checkpoint(path, checkpoint)
    except FileNotFoundError as err:
        found = sorted(p.name for p in Path(path).iterdir())[:12] if Path(path).is_dir() else []
        hint = (" It holds config.yaml but no checkpoint: the run stopped before its first checkpoint "
                "(train.checkpoint_every) or its checkpoints/ folder was removed."
                if (Path(path) / "config.yaml").exists() else f" It holds: {', '.join(found) or 'nothing'}.")
        raise RunError(f"{err}.{hint}") from err
    older = [str(p) for p in list_checkpoints(ckpt.parent) if p != ckpt][-2:]
    fix = (f"; try an older checkpoint: {', '.join(reversed(older))}" if older
           else "; no other checkpoint in that folder: retrain, or restore the file")
    try:
        payload = torch.load(ckpt, map_location=device, weights_only=False)
    except Exception as err:  # noqa: BLE001 - truncated zip, pickle garbage, wrong file: all mean "corrupt"
        raise RunError(f"checkpoint {ckpt} is corrupt or not a reverie checkpoint "
                       f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}){fix}") from err
    missing = [k for k in CHECKPOINT_KEYS if not isinstance(payload, dict) or k not in payload]
    if missing:
        raise RunError(f"checkpoint {ckpt} lacks {missing}: it was not written by `reverie train`{fix}")
    config = payload["config"]
    agent_cfg = OmegaConf.create(config["agent"])
    agent_cfg.module.device = device
    if planner is not None or plan:
        set_planner(agent_cfg, planner, plan)
    agent = build_agent(agent_cfg, payload["obs_shapes"], payload["action_spec"])
    try:
        agent.load_state_dict(payload["agent"])
    except (RuntimeError, KeyError, ValueError) as err:
        raise RunError(f"checkpoint {ckpt} does not fit the agent its config describes "
                       f"({type(err).__name__}: {str(err).splitlines()[0]}){fix}") from err
    agent.eval()
    counters = dict(payload.get("counters", {}))
    if "eval_return" in payload:  # best.pt: the evaluation it was kept for
        counters["eval_return"] = payload["eval_return"]
    run = LoadedRun(agent, config, payload["obs_shapes"], payload["action_spec"], counters)
    run.directory, run.checkpoint, run.checkpoint_kind = run_directory(ckpt), ckpt, kind
    return run


def describe_checkpoint(run: LoadedRun) -> str:
    """``"checkpoints/best.pt (best: the weights of the best evaluation; env step 7,500, eval return 487.6)"``."""
    where = run.checkpoint
    try:
        where = run.checkpoint.relative_to(run.directory)
    except (TypeError, ValueError):
        pass
    facts = [f"env step {run.counters['env_steps']:,}"] if "env_steps" in run.counters else []
    if "eval_return" in run.counters:
        facts.append(f"eval return {run.counters['eval_return']:.1f}")
    return f"{where} ({run.checkpoint_kind}{'; ' + ', '.join(facts) if facts else ''})"


def set_planner(agent_cfg: Any, planner: str | None, plan: dict | None) -> None:
    """Set ``agent_cfg.module.planner`` (unless None) and update ``agent_cfg.module.plan`` with ``plan``.

    Raises RunError: not DreamerV3, an unknown planner, an unknown or out-of-range setting
    (:func:`reverie.agents.dreamer_planning.check_plan`), or settings for a run that acts with its actor.
    """
    from reverie.agents.dreamer_planning import PLANNERS, check_plan

    if agent_cfg.get("name") != "dreamerv3":
        hints = {"planet": " (it always plans with CEM; its settings are agent.module.horizon, candidates, ...)",
                 "dreamerv3_2025": " (the 2023 agent, agent=dreamerv3; the 2024-25 one acts with its actor only)"}
        raise RunError(f"planner settings apply to DreamerV3 runs; this run's agent is {agent_cfg.get('name')!r}"
                       f"{hints.get(agent_cfg.get('name'), '')}")
    if planner is not None and planner not in PLANNERS:
        raise RunError(f"planner must be one of {', '.join(PLANNERS)}, got {planner!r}")
    acting = planner if planner is not None else agent_cfg.module.get("planner", "actor")
    if plan and acting == "actor":
        raise RunError(f"planner settings {sorted(plan)} given, but this run acts with its actor (agent.module.planner="
                       f"actor), which does not use them: choose a planner too (--planner cem or mppi; "
                       f"load_run(..., planner='cem'))")
    saved = agent_cfg.module.get("plan")  # None in runs from before planning existed
    merged = {**(OmegaConf.to_container(saved) if saved is not None else {}), **(plan or {})}
    try:
        check_plan(merged)
    except ValueError as err:
        raise RunError(str(err)) from err
    if planner is not None:
        agent_cfg.module.planner = planner
    agent_cfg.module.plan = merged


def version_mismatches(run: LoadedRun) -> list[str]:
    """Simulator packages whose installed version differs from the run's ``env_metadata.json`` (e.g.
    ``"ale-py: run 0.11.0, installed 0.12.1"``); empty when they match or none was recorded."""
    import json

    from reverie.envs.factory import env_metadata

    saved = run.directory / "env_metadata.json" if run.directory is not None else None
    if saved is None or not saved.is_file():
        return []
    recorded = json.loads(saved.read_text(encoding="utf-8")).get("versions", {})
    installed = env_metadata(run.config["env"]).get("versions", {})
    return [f"{name}: run {version}, installed {installed.get(name, 'none')}"
            for name, version in sorted(recorded.items()) if installed.get(name) != version]
