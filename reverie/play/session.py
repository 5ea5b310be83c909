"""The state behind ``reverie play``: a real env and the world model's dream, stepped with the same actions.

Each action ``a_t`` (keys, or the policy with ``driver="policy"``) steps the real env, which the posterior filter
follows (``post_{t+1} = q(. | post_t, a_t, obs_{t+1})``), and the dream by ``img_step`` (prior; shown: its decoded
state, predicted reward and continue probability). The dream starts from the real posterior (``dream_start="real"``)
or the initial state; latents are the mode unless ``sample=True``. World models without decoders (``r2``,
``infonce``) show the predictions and the latent agreement (cosine of dream and posterior features). docs/play.md.
"""

from __future__ import annotations

import base64
import io
from typing import Any

import numpy as np
import torch

from reverie.envs import make_env, to_env_action
from reverie.loop.evaluate import EVAL_SEED_OFFSET, render_config
from reverie.play.keymap import KeyMap
from reverie.viz.grid import to_hwc
from reverie.viz.openloop import cosine, decode_mode, find_world_model, has_decoder, objective_name

DRIVERS = ("person", "policy")
DREAM_STARTS = ("real", "initial")
HISTORY = 200  # steps kept for the plots and the step table
IMAGE_SIDE = 256  # observation images are upscaled (nearest neighbour, by an integer) to about this many pixels


def png_data_uri(image: np.ndarray, scale: int = 1) -> str:
    """uint8 ``(H, W, 3)`` -> ``data:image/png;base64,...`` (nearest-neighbour upscaled by ``scale``)."""
    import imageio.v3 as iio

    if scale > 1:
        image = image.repeat(scale, 0).repeat(scale, 1)
    buffer = io.BytesIO()
    iio.imwrite(buffer, image, extension=".png")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


class StepRefused(RuntimeError):
    """A step the session cannot take now (the real episode is over); the message says what to do."""


class PlaySession:
    """A run's real env and its world model's dream, stepped together (module docstring). The env is built with
    ``render_mode="rgb_array"`` where it accepts one and seeded as the run's first evaluation env
    (``seed + EVAL_SEED_OFFSET``). TypeError: the agent has no world model ``agent.wm``."""

    def __init__(self, agent: Any, env_cfg: Any, spec: Any, seed: int, sample: bool = False):
        self.agent, self.spec, self.sample = agent, spec, bool(sample)
        self.wm = find_world_model(agent)
        self.decoded = has_decoder(self.wm)  # False: no decoded observations, the predictions alone
        self.shown_vector_keys = list(self.wm.vector_keys) if self.decoded else []
        try:
            self.env, self.render = make_env(render_config(env_cfg), seed + EVAL_SEED_OFFSET), True
        except TypeError:  # a user env whose constructor takes no render_mode
            self.env, self.render = make_env(env_cfg, seed + EVAL_SEED_OFFSET), False
        meanings = getattr(self.env.unwrapped, "get_action_meanings", None)
        self.keymap = KeyMap.for_env(spec, list(meanings()) if callable(meanings) else None)
        self.device = next(self.wm.parameters()).device
        self.driver, self.dream_start = "person", "real"
        self.reset()

    def _tensor_obs(self, obs: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        return self.wm.tensors({k: np.asarray(obs[k])[None, None] for k in self.wm.obs_shapes})  # (1, 1, ...)

    def _filter(self, obs: dict[str, np.ndarray], action: np.ndarray | None) -> dict[str, torch.Tensor]:
        """The state ``(1, ...)`` after ``obs`` (``action`` None: the first observation): the truncated posterior."""
        first = action is None
        prev = torch.zeros(1, 1, self.spec.dim, device=self.device) if first else \
            torch.as_tensor(action, dtype=torch.float32, device=self.device).reshape(1, 1, -1)
        post, _ = self.wm.dynamics.observe(self.wm.encode(self._tensor_obs(obs)), prev,
                                           torch.tensor([[first]], device=self.device), None if first else self.post,
                                           sample=False)
        return self.wm.dynamics.truncate(post)  # (1, 1, ...) -> (1, ...)

    def _decode(self, state: dict[str, torch.Tensor]) -> dict[str, Any]:
        """Decoded observation (if decoders), predicted reward and continue probability of a state ``(1, ...)``."""
        feat = self.wm.dynamics.features(state)
        cont = self.wm.cont(feat).mean if hasattr(self.wm, "cont") else None
        obs = {k: v[0] for k, v in decode_mode(self.wm, feat).items()} if self.decoded else {}
        return {"obs": obs, "reward": float(self.wm.reward(feat).mean[0]),
                "cont": None if cont is None else float(cont[0])}

    def latent_agreement(self) -> float:
        """The cosine between the dream's features and the real posterior's, now."""
        features = self.wm.dynamics.features
        return float(cosine(features(self.dream), features(self.post))[0])

    def _model_action(self, action: Any) -> np.ndarray:
        """An index (Discrete) or ``(A,)`` vector -> the model's ``(A,)`` float32 action (one-hot or clipped)."""
        if self.spec.discrete:
            index = int(action)
            if not 0 <= index < self.spec.dim:
                raise ValueError(f"action index {index} outside Discrete({self.spec.dim})")
            return np.eye(self.spec.dim, dtype=np.float32)[index]
        vector = np.asarray(action, np.float32).reshape(-1)
        if vector.shape != (self.spec.dim,):
            raise ValueError(f"action must have {self.spec.dim} entries, got {vector.shape}")
        return np.clip(vector, -1.0, 1.0)

    @torch.inference_mode()
    def reset(self) -> None:
        """New real episode (the env's seeded stream), fresh filter, dream restarted, histories cleared."""
        self.obs, _ = self.env.reset()
        self.prev = None  # (post, action) before the last observation: the policy's state
        self.post = self._filter(self.obs, None)
        self.real_step, self.real_return, self.real_reward, self.done = 0, 0.0, 0.0, False
        self.history: dict[str, list] = {"step": [], "action": [], "true_reward": [], "pred_reward": [], "cont": [],
                                         "real_obs": [], "dream_obs": [], "latent": []}
        self.restart_dream()

    @torch.inference_mode()
    def restart_dream(self) -> None:
        """The dream starts again from the real env's posterior (``"real"``) or the initial state."""
        self.dream = {k: v.clone() for k, v in self.post.items()} if self.dream_start == "real" else \
            self.wm.dynamics.initial(1)
        self.dream_step, self.dream_return = 0, 0.0
        self.dream_out = self._decode(self.dream)

    def set_modes(self, driver: str | None = None, dream_start: str | None = None) -> None:
        """Change who drives and where the dream starts (a new start restarts the dream); ValueError: unknown mode."""
        if driver is not None and driver not in DRIVERS:
            raise ValueError(f"driver must be one of {DRIVERS}, got {driver!r}")
        if dream_start is not None and dream_start not in DREAM_STARTS:
            raise ValueError(f"dream_start must be one of {DREAM_STARTS}, got {dream_start!r}")
        self.driver = driver or self.driver
        if dream_start is not None and dream_start != self.dream_start:
            self.dream_start = dream_start
            self.restart_dream()

    @torch.inference_mode()
    def policy_action(self) -> int | np.ndarray:
        """The agent's policy-mode action at the real env's current observation (index or ``(A,)``)."""
        row = {k: np.asarray(self.obs[k])[None] for k in self.wm.obs_shapes}
        row["is_first"] = np.array([self.prev is None])
        state = None if self.prev is None else (self.prev[0], torch.as_tensor(self.prev[1], device=self.device)[None])
        action, _ = self.agent.act(row, state, "eval")
        env_action = to_env_action(action, self.spec)[0]
        return int(env_action) if self.spec.discrete else env_action

    @torch.inference_mode()
    def step(self, action: Any) -> None:
        """Step both panes with ``action`` (index or ``(A,)`` in ``[-1, 1]``). Raises StepRefused when the real
        episode is over, ValueError for an action outside the space."""
        if self.done:
            raise StepRefused("the real episode is over: press reset")
        model_action = self._model_action(action)
        env_action = int(action) if self.spec.discrete else model_action
        self.obs, reward, terminated, truncated, _ = self.env.step(env_action)
        self.prev = (self.post, model_action)
        self.post = self._filter(self.obs, model_action)
        self.real_step, self.real_reward = self.real_step + 1, float(reward)
        self.real_return += float(reward)
        self.done = bool(terminated or truncated)
        self.dream = self.wm.dynamics.img_step(self.dream, torch.as_tensor(model_action, device=self.device)[None],
                                               sample=self.sample)
        self.dream_out = self._decode(self.dream)
        self.dream_step += 1
        self.dream_return += self.dream_out["reward"]
        h = self.history
        for key, value in (("step", self.real_step), ("action", self.keymap.label(action)),
                           ("true_reward", float(reward)), ("pred_reward", self.dream_out["reward"]),
                           ("cont", self.dream_out["cont"]), ("latent", self.latent_agreement()),
                           ("real_obs", {k: np.asarray(self.obs[k]).tolist() for k in self.shown_vector_keys}),
                           ("dream_obs", {k: self.dream_out["obs"][k].tolist() for k in self.shown_vector_keys})):
            h[key] = (h[key] + [value])[-HISTORY:]

    def close(self) -> None:
        """Close the env. Call it on the thread the session was built and used on: a DMC env frees its EGL context
        there (from another thread, or left to dm_control's exit handler, that fails with ``EGL_BAD_ACCESS``)."""
        self.env.close()

    def snapshot(self) -> dict[str, Any]:
        """Everything the page shows, JSON-ready: both panes' step counts, images (data URIs), rewards, the
        modes, the key map and the recent history (plots and the step table)."""
        scale = {k: max(1, IMAGE_SIDE // self.wm.obs_shapes[k][-1]) for k in self.wm.image_keys}
        images = {k: png_data_uri(to_hwc(np.asarray(self.obs[k])), scale[k]) for k in self.wm.image_keys}
        dream_images = {k: png_data_uri(to_hwc(self.dream_out["obs"][k]), scale[k]) for k in self.wm.image_keys
                        if k in self.dream_out["obs"]}
        frame = None
        if self.render:
            rendered = self.env.render()
            frame = None if rendered is None else png_data_uri(np.asarray(rendered, np.uint8))
        return {
            "real": {"step": self.real_step, "reward": self.real_reward, "return": self.real_return, "done": self.done,
                     "frame": frame, "images": images},
            "dream": {"step": self.dream_step, "reward": self.dream_out["reward"], "cont": self.dream_out["cont"],
                      "return": self.dream_return, "images": dream_images},
            "modes": {"driver": self.driver, "dream_start": self.dream_start, "sample": self.sample},
            "vector_keys": self.shown_vector_keys,
            "decoded": self.decoded, "representation": objective_name(self.wm),
            "keymap": self.keymap.to_json(),
            "history": self.history,
        }
