"""Per-episode evaluation videos, optionally side by side with the world model's open loop of the same actions.

Used by :func:`reverie.loop.evaluate.evaluate` (``recorder=``) for ``reverie eval``; per kept episode ``k``:
``episode_<k>.mp4`` (``env.render()``), ``episode_<k>_openloop.mp4`` per image key (rows observation / model /
|error|) or ``episode_<k>_openloop.png`` (vector keys, or the reward plot without decoders); see docs/viz.md.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from reverie.logs.video import mp4_writer, pad_even
from reverie.viz.grid import abs_error, upscale, video_grid
from reverie.viz.openloop import find_world_model, has_decoder, open_loop
from reverie.viz.quality import prediction_quality
from reverie.viz.reward_plot import reward_plot
from reverie.viz.vector_plot import vector_plot


class EpisodeRecorder:
    """Streams each env copy's rendered frames to an mp4 and keeps the rows the open-loop video needs.

    Call ``observe(row, frames)`` after reset and every step, ``act(action)`` after every policy step,
    ``finish(env, index)`` when an episode ends (``index`` None drops it), ``close()`` at the end.
    ``openloop_agent`` (an agent with ``.wm``, or None) adds the open-loop comparison (``context`` observed steps,
    then open loop; at most ``max_openloop_steps`` steps), upscaled ``scale`` times; ``quality`` maps each such
    episode to its :func:`reverie.viz.quality.prediction_quality`.
    """

    def __init__(self, directory: str | Path, fps: int = 30, render: bool = True, openloop_agent: Any = None,
                 context: int = 5, max_openloop_steps: int = 500, scale: int = 3):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.fps, self.render, self.context, self.scale = fps, render, context, scale
        self.agent, self.max_steps = openloop_agent, max_openloop_steps
        wm = find_world_model(openloop_agent) if openloop_agent is not None else None
        self.keys = tuple(wm.obs_shapes) if wm is not None else ()
        self.decoded = wm is not None and has_decoder(wm)  # False: the reward / latent plot instead of videos
        self._writers: dict[int, Any] = {}
        self._rows: dict[int, list[dict[str, np.ndarray]]] = {}
        self.written: list[Path] = []
        self.quality: dict[int, dict[str, float]] = {}  # episode -> prediction_quality of its open loop

    def _temp(self, env: int) -> Path:
        return self.directory / f".env{env}.partial.mp4"

    def observe(self, row: dict[str, np.ndarray], frames: list[np.ndarray] | None) -> None:
        """Record row ``(N, ...)`` and its rendered ``frames`` (N of ``(H, W, 3)``, or None without rendering)."""
        for i in range(len(row["is_first"])):
            if row["is_first"][i]:
                self._begin(i)
            if self.render and frames is not None and i in self._writers:
                self._writers[i].append_data(pad_even(np.asarray(frames[i], np.uint8)))
            if self.agent is not None and len(self._rows[i]) < self.max_steps:
                self._rows[i].append({k: np.asarray(row[k][i]) for k in (*self.keys, "reward", "is_first",
                                                                          "is_terminal")})

    def act(self, action: np.ndarray) -> None:
        """The model actions ``(N, A)`` chosen at the rows just observed."""
        for i, rows in self._rows.items():
            if rows and "action" not in rows[-1]:
                rows[-1]["action"] = np.asarray(action[i], np.float32)

    def finish(self, env: int, index: int | None) -> None:
        """End env ``env``'s episode: keep it as episode ``index`` or drop it (None)."""
        writer = self._writers.pop(env, None)
        if writer is not None:
            writer.close()
            if index is None:
                self._temp(env).unlink(missing_ok=True)
            else:
                path = self.directory / f"episode_{index:03d}.mp4"
                os.replace(self._temp(env), path)
                self.written.append(path)
        rows = self._rows.pop(env, [])
        if index is not None and self.agent is not None and len(rows) >= 2:
            self._write_openloop(rows, index)

    def close(self) -> None:
        """Close and delete unfinished videos."""
        for env in list(self._writers):
            self.finish(env, None)

    def _begin(self, env: int) -> None:
        if env in self._writers:  # a new episode without finish(): drop the unfinished one
            self.finish(env, None)
        if self.render:
            self._writers[env] = mp4_writer(self._temp(env), self.fps)
        if self.agent is not None:
            self._rows[env] = []

    def _write_openloop(self, rows: list[dict[str, np.ndarray]], index: int) -> None:
        T = len(rows)
        batch = {k: np.stack([r[k] for r in rows])[:, None] for k in (*self.keys, "reward", "is_first", "is_terminal")}
        actions = np.stack([r.get("action", np.zeros_like(rows[0]["action"])) for r in rows])  # (T, A)
        prev = np.concatenate([np.zeros_like(actions[:1]), actions[:-1]])  # prev_action_t = action_{t-1}
        batch["prev_action"] = prev[:, None]  # (T, A) -> (T, 1, A)
        result = open_loop(self.agent, batch, context=max(1, min(self.context, T - 1)), sample=False)
        self.quality[index] = prediction_quality(result)  # PSNR / SSIM per open-loop step (reverie.viz.quality)
        images = result.image_keys
        for key in images:
            truth = result.truth[key]
            grid = video_grid([truth, result.openloop[key], abs_error(truth, result.openloop[key])], result.context)
            name = f"episode_{index:03d}_openloop{'_' + key if len(images) > 1 else ''}.mp4"
            with mp4_writer(self.directory / name, self.fps) as writer:
                for frame in upscale(grid, self.scale):
                    writer.append_data(pad_even(frame))
            self.written.append(self.directory / name)
        if not images:
            import imageio.v3 as iio

            if not self.decoded:  # no decoders: what the model predicts, rewards, continue and its latent
                name = f"episode_{index:03d}_openloop.png"
                iio.imwrite(self.directory / name, reward_plot(result, 1))
                self.written.append(self.directory / name)
            for key in result.vector_keys:
                name = f"episode_{index:03d}_openloop{'_' + key if len(result.vector_keys) > 1 else ''}.png"
                iio.imwrite(self.directory / name, vector_plot(result, key))
                self.written.append(self.directory / name)
