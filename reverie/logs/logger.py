"""Run logging: ``metrics.jsonl`` and ``scores.jsonl`` always, TensorBoard by default, wandb optional.

Files under the run directory (docs/metrics.md, docs/viz.md): ``metrics.jsonl`` (one ``{"step": env_step,
"<name>": interval mean, ...}`` per :meth:`Logger.write`), ``scores.jsonl`` (one ``{"step", "frames", "return",
"length", "mode"}`` per episode), ``tb/``, ``videos/<name>_<step>.mp4``, ``plots/<name>_<step>.png``,
``wandb.json`` (the wandb run id, so a resumed run continues it) and ``wandb/``. The x axis is the env step
(policy steps summed over parallel envs). TensorBoard gets each video as an animated GIF image summary (written
here with Pillow: ``add_video`` needs ``moviepy<2``) plus a filmstrip under ``<name>/filmstrip``. Non-finite values
are written as ``NaN`` / ``Infinity`` (``json``'s default), so a diverged loss stays visible.
"""

from __future__ import annotations

import contextlib
import json
import numbers
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from reverie.logs.video import (ClipWriter, _as_video, as_frames, filmstrip, gif_bytes, gif_from_indices,  # noqa: F401
                                 mp4_writer, pad_even)

#: Backends the Logger knows. "none" (or an empty list) means jsonl files only.
SUPPORTED_BACKENDS = ("tensorboard", "wandb", "none")

class Logger:
    """Writes scalars (reduced to their mean over each interval between writes), episode scores and videos of a run.

    Args:
        directory: the run directory (created); existing jsonl files are appended to, so a resumed run continues.
        backends: ``"tensorboard"``, ``"wandb"``, ``"none"`` (one string or a sequence); ``"none"`` or ``[]``:
            jsonl files (and videos) only.
        config: the resolved run config (dict or ``DictConfig``): wandb's run config, TensorBoard's text summary.
        wandb_kwargs: ``wandb.init`` arguments; without ``id``, the one in ``directory/wandb.json`` is reused.
        purge_step: on resume, the first env step logged again: TensorBoard hides the stopped run's events from
            there on (``SummaryWriter(purge_step=...)``); None purges nothing.

    Raises:
        ValueError: an unknown backend. ImportError: ``"wandb"`` requested but not installed.
    """

    def __init__(
        self,
        directory: str | Path,
        backends: Sequence[str] | str = ("tensorboard",),
        config: Mapping[str, Any] | None = None,
        wandb_kwargs: Mapping[str, Any] | None = None,
        purge_step: int | None = None,
    ) -> None:
        self.directory = Path(directory)
        self._purge_step = purge_step
        self.backends = _parse_backends(backends)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._config = _to_plain_dict(config)
        self._sums: dict[str, float] = {}
        self._counts: dict[str, int] = {}
        self._closed = False
        self._tb = None
        self._wandb = None  # the wandb module once a run is started
        self._wandb_run = None
        self._metrics_file = open(self.directory / "metrics.jsonl", "a", encoding="utf-8")
        self._scores_file = open(self.directory / "scores.jsonl", "a", encoding="utf-8")
        try:
            if "tensorboard" in self.backends:
                self._start_tensorboard()
            if "wandb" in self.backends:
                self._start_wandb(dict(wandb_kwargs or {}))
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ scalars

    def scalar(self, name: str, value: Any) -> None:
        """Adds one value (a number, or a size-1 array or tensor) of scalar ``name`` to the current interval."""
        self._check_open()
        _check_name(name)
        value = _to_float(name, value)
        self._sums[name] = self._sums.get(name, 0.0) + value
        self._counts[name] = self._counts.get(name, 0) + 1

    def scalars(self, values: Mapping[str, Any], prefix: str = "") -> None:
        """Calls ``scalar`` for every item of ``values``; names become ``prefix + name``."""
        for name, value in values.items():
            self.scalar(prefix + name, value)

    def write(self, step: int, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Writes and returns ``{"step": step, **interval means, **extra}`` (the ``metrics.jsonl`` record), then
        clears the means. ``extra``: numbers written as they are, not averaged.

        Raises:
            ValueError: an ``extra`` key was also accumulated with ``scalar`` in this interval.
        """
        self._check_open()
        step = _to_step(step)
        record: dict[str, Any] = {"step": step}
        for name, total in self._sums.items():
            record[name] = total / self._counts[name]
        for name, value in (extra or {}).items():
            _check_name(name)
            if name in self._sums:
                raise ValueError(
                    f"Logger.write: extra key {name!r} was also accumulated with scalar() in this interval; "
                    f"log it one way only (or rename one of them)."
                )
            is_int = isinstance(value, numbers.Integral) and not isinstance(value, bool)
            record[name] = int(value) if is_int else _to_float(name, value)
        self._sums.clear()
        self._counts.clear()
        self._metrics_file.write(json.dumps(record) + "\n")
        self._metrics_file.flush()
        data = {k: float(v) for k, v in record.items() if k != "step"}
        if self._tb is not None:
            for name, value in data.items():
                self._tb.add_scalar(name, value, global_step=step)
            self._tb.flush()
        self._wandb_log(data, step)
        return record

    @property
    def pending(self) -> dict[str, float]:
        """The interval means that the next ``write`` would write (a copy; for inspection)."""
        return {name: total / self._counts[name] for name, total in self._sums.items()}

    # ------------------------------------------------------------------ episodes

    def episode(self, step: int, frames: int, ret: float, length: int, mode: str = "train") -> dict[str, Any]:
        """Appends and returns ``{"step", "frames", "return", "length", "mode"}`` in ``scores.jsonl`` and logs
        ``{mode}/episode_return`` and ``{mode}/episode_length``. ``frames``: env steps times action repeat;
        ``ret``: the undiscounted return; ``mode``: a name without ``/`` (``"train"``, ``"eval"``; else ValueError).
        """
        self._check_open()
        if not isinstance(mode, str) or not mode or "/" in mode:
            raise ValueError(f"Logger.episode: mode must be a name like 'train' or 'eval', got {mode!r}.")
        record = {
            "step": _to_step(step),
            "frames": _to_step(frames, what="frames"),
            "return": _to_float("return", ret),
            "length": _to_step(length, what="length"),
            "mode": mode,
        }
        self._scores_file.write(json.dumps(record) + "\n")
        self._scores_file.flush()
        data = {f"{mode}/episode_return": record["return"], f"{mode}/episode_length": float(record["length"])}
        if self._tb is not None:
            for name, value in data.items():
                self._tb.add_scalar(name, value, global_step=record["step"])
            self._tb.flush()
        self._wandb_log(data, record["step"])
        return record

    # ------------------------------------------------------------------ videos

    def video(self, name: str, frames: Any, step: int, fps: int = 30) -> Path:
        """Writes ``videos/{name}_{step}.mp4`` (H.264, yuv420p; ``/`` in ``name`` becomes ``_``) and returns its path;
        also logs it to TensorBoard (GIF and filmstrip) and wandb. ``frames``: uint8 ``(T, H, W, 3)``,
        ``(T, 3, H, W)`` or ``(T, H, W)``, or a list of such frames; odd sizes are padded by one edge pixel.
        """
        video = as_frames(frames)  # (H, W, 3) frames, never one copy of the whole clip
        with self.clip(name, step, fps) as clip:
            for frame in video:
                clip.add(frame)
        return clip.path

    @contextlib.contextmanager
    def clip(self, name: str, step: int, fps: int = 30) -> Iterator[ClipWriter]:
        """:meth:`video` with frames added one by one (``clip.add(frame)``) as an episode plays, never held in full
        colour (:class:`ClipWriter`). A clip that got no frame writes nothing."""
        self._check_open()
        _check_name(name)
        step = _to_step(step)
        clip = ClipWriter(self.directory / "videos" / f"{name.replace('/', '_')}_{step}.mp4", fps)
        try:
            yield clip
        finally:
            clip.close()
        if not clip.indices:
            return
        if self._tb is not None:
            self._tb_gif(name, clip, step, fps)
            self._tb.add_image(f"{name}/filmstrip", clip.filmstrip(), global_step=step, dataformats="HWC")
            self._tb.flush()
        if self._wandb_run is not None:
            # From the file: wandb.Video built from an array would need moviepy to encode it.
            self._wandb_log({name: self._wandb.Video(str(clip.path), fps=fps, format="mp4")}, step)

    def _tb_gif(self, name: str, clip: ClipWriter, step: int, fps: int) -> None:
        """An animated GIF image summary: what ``SummaryWriter.add_video`` writes, encoded without moviepy."""
        from tensorboard.compat.proto.summary_pb2 import Summary

        gif = gif_from_indices(clip.indices, fps)
        image = Summary.Image(height=clip.shape[0], width=clip.shape[1], colorspace=3, encoded_image_string=gif)
        self._tb._get_file_writer().add_summary(Summary(value=[Summary.Value(tag=name, image=image)]), step)

    # ------------------------------------------------------------------ images and figures

    def image(self, name: str, image: np.ndarray, step: int) -> Path:
        """Writes ``plots/{name}_{step}.png`` of uint8 ``image`` ``(H, W, 3)``, ``(3, H, W)`` or ``(H, W)``, logs it
        to TensorBoard and wandb and returns the path.

        Raises:
            TypeError/ValueError: not uint8, or not one of those shapes.
        """
        self._check_open()
        _check_name(name)
        import imageio.v3 as iio

        step = _to_step(step)
        picture = _as_video(np.asarray(image)[None])[0]  # (H, W, 3) uint8, same checks as a one-frame video
        path = self.directory / "plots" / f"{name.replace('/', '_')}_{step}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        iio.imwrite(path, picture)
        if self._tb is not None:
            self._tb.add_image(name, picture, global_step=step, dataformats="HWC")
            self._tb.flush()
        if self._wandb_run is not None:
            self._wandb_log({name: self._wandb.Image(str(path))}, step)
        return path

    # ------------------------------------------------------------------ checkpoints as wandb artifacts

    def log_checkpoint_artifact(self) -> str | None:
        """Logs the newest ``checkpoints/ckpt_*.pt`` (with ``config.yaml`` and ``best.pt``) as wandb artifact
        ``<run id>-checkpoint`` (type ``model``) and returns that name; None without wandb or a checkpoint."""
        if self._wandb_run is None:
            return None
        from reverie.state.checkpoint import BEST_FILE, CKPT_PATTERN, list_checkpoints

        found = list_checkpoints(self.directory / "checkpoints")
        if not found:
            return None
        step = int(CKPT_PATTERN.search(found[-1].name).group(1))
        name = f"{self._wandb_run.id}-checkpoint"
        artifact = self._wandb.Artifact(name, type="model", metadata={"env_step": step})
        artifact.add_file(str(found[-1]), name=found[-1].name)
        if (self.directory / "config.yaml").exists():
            artifact.add_file(str(self.directory / "config.yaml"), name="config.yaml")
        best = self.directory / "checkpoints" / BEST_FILE
        if best.is_file():  # the best evaluation's weights: what `reverie eval` loads by default
            artifact.add_file(str(best), name=BEST_FILE)
        self._wandb_run.log_artifact(artifact, aliases=["latest", f"step_{step}"])
        return name

    # ------------------------------------------------------------------ lifetime

    @property
    def wandb_run_id(self) -> str | None:
        """The wandb run id (also stored in ``wandb.json``), or None without the wandb backend."""
        return None if self._wandb_run is None else self._wandb_run.id

    def close(self) -> None:
        """Closes files and backends (idempotent); scalars accumulated since the last ``write`` are dropped."""
        if self._closed:
            return
        self._closed = True
        for f in (getattr(self, "_metrics_file", None), getattr(self, "_scores_file", None)):
            if f is not None:
                f.close()
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._wandb_run is not None:
            try:
                self.log_checkpoint_artifact()
            finally:
                self._wandb_run.finish()
                self._wandb_run = None

    def __enter__(self) -> Logger:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:  # best effort; close() explicitly or use `with`
        try:
            self.close()
        except Exception:
            pass

    # ------------------------------------------------------------------ backends

    def _start_tensorboard(self) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self._tb = SummaryWriter(log_dir=str(self.directory / "tb"), purge_step=self._purge_step)
        if self._config:
            text = json.dumps(self._config, indent=2, default=str)
            # Markdown: indent by 4 spaces so TensorBoard shows it as a code block.
            self._tb.add_text("config", "\n".join("    " + line for line in text.splitlines()), 0)

    def _start_wandb(self, kwargs: dict[str, Any]) -> None:
        try:
            import wandb
        except ImportError as error:
            raise ImportError(
                "The 'wandb' logger backend needs the wandb package, which is not installed. "
                "Install it with `pip install reverie[wandb]` (or `pip install wandb`), "
                "or drop 'wandb' from the logger backends."
            ) from error
        id_file = self.directory / "wandb.json"
        if "id" not in kwargs and id_file.exists():
            kwargs["id"] = json.loads(id_file.read_text(encoding="utf-8"))["id"]
        if "id" in kwargs:
            kwargs.setdefault("resume", "allow")
        kwargs.setdefault("dir", str(self.directory))
        if self._config:
            kwargs.setdefault("config", self._config)
        run = wandb.init(**kwargs)
        self._wandb, self._wandb_run = wandb, run
        # x axis: env_step as a metric; wandb's own `step` must increase on every call (drops out-of-order logs).
        run.define_metric("env_step")
        run.define_metric("*", step_metric="env_step")
        id_file.write_text(
            json.dumps({"id": run.id, "project": getattr(run, "project", None),
                        "entity": getattr(run, "entity", None), "mode": kwargs.get("mode")}) + "\n",
            encoding="utf-8",
        )

    def _wandb_log(self, data: Mapping[str, Any], step: int) -> None:
        if self._wandb_run is not None and data:
            self._wandb_run.log({**data, "env_step": step})

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"Logger for {self.directory} is closed; create a new Logger to log more.")


# ---------------------------------------------------------------------- helpers


def _parse_backends(backends: Sequence[str] | str | None) -> tuple[str, ...]:
    if backends is None:
        return ()
    if isinstance(backends, str):
        backends = [backends]
    parsed: list[str] = []
    for backend in backends:
        if backend not in SUPPORTED_BACKENDS:
            raise ValueError(
                f"Unknown logger backend {backend!r}; supported: {', '.join(SUPPORTED_BACKENDS)} "
                f"(jsonl files are always written; 'none' or [] means jsonl only)."
            )
        if backend != "none" and backend not in parsed:
            parsed.append(backend)
    return tuple(parsed)


def _to_plain_dict(config: Any) -> dict[str, Any] | None:
    if config is None:
        return None
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(config, DictConfig):
            return OmegaConf.to_container(config, resolve=True)  # type: ignore[return-value]
    except ImportError:  # pragma: no cover - omegaconf is a dependency
        pass
    if not isinstance(config, Mapping):
        raise TypeError(f"Logger config must be a dict or an OmegaConf DictConfig, got {type(config).__name__}.")
    return dict(config)


def _check_name(name: str) -> None:
    if not isinstance(name, str) or not name:
        raise ValueError(f"Metric names must be non-empty strings, got {name!r}.")
    if name == "step":
        raise ValueError("'step' is reserved for the env step in metrics.jsonl; pick another metric name.")


def _to_float(name: str, value: Any) -> float:
    """A float from a number, numpy scalar/size-1 array or size-1 tensor; a clear error otherwise."""
    if isinstance(value, (str, bytes)):
        raise TypeError(f"Metric {name!r} must be a number, got {type(value).__name__}: {value!r}.")
    if hasattr(value, "numel"):  # torch tensor
        numel = value.numel()
    elif isinstance(value, (np.ndarray, np.generic)):
        numel = value.size
    else:
        numel = 1
    if numel != 1:
        shape = tuple(getattr(value, "shape", ()))
        raise TypeError(
            f"Metric {name!r} must be a single number, got {type(value).__name__} of shape {shape}; "
            f"reduce it first (e.g. value.mean()) or log each element under its own name."
        )
    if hasattr(value, "item"):  # size-1 arrays/tensors of any rank (float() refuses 1-d arrays in numpy 2)
        value = value.item()
    try:
        return float(value)
    except (TypeError, ValueError) as error:
        raise TypeError(f"Metric {name!r} must be a number, got {type(value).__name__}: {value!r}.") from error


def _to_step(step: Any, what: str = "step") -> int:
    if isinstance(step, bool) or not isinstance(step, numbers.Integral):
        if isinstance(step, numbers.Real) and float(step).is_integer():
            return int(step)
        raise TypeError(f"{what} must be an integer (env steps), got {step!r}.")
    if step < 0:
        raise ValueError(f"{what} must be >= 0, got {step}.")
    return int(step)


__all__ = ["Logger", "SUPPORTED_BACKENDS", "filmstrip", "gif_bytes", "mp4_writer", "pad_even"]  # re-exported
