"""Starting a run for :class:`reverie.loop.session.Session`: a fresh run (the ``init_from`` run's agent, the replay
filled from a dataset) or a resumed one (the agent, the replay, the envs where they pickle, the loop state)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


from reverie.state import ranks


class SessionStart:
    """The start and restore steps of :class:`reverie.loop.session.Session` (built first: :class:`SessionBuild`)."""

    def _start(self, dataset: Any) -> None:
        """A fresh run: the ``init_from`` run's agent, then the replay filled with the dataset (offline: the one
        to learn from; with ``init_from`` and ``init.keep_data``: that run's replay)."""
        from reverie.data import fill_replay, load_dataset

        cfg = self.cfg
        if cfg.get("init_from"):
            from reverie.state.init_from import apply_init, load_init

            payload = load_init(cfg.init_from)
            loaded = apply_init(self.agent, payload, self.obs_shapes, self.spec)
            print(f"[reverie] init_from {cfg.init_from}: {', '.join(loaded)} from "
                  f"{Path(payload['checkpoint_path']).name}")
            if dataset is None and cfg.init.keep_data:
                dataset = load_dataset(cfg.init_from, cfg.env)
        elif self.offline and dataset is None:
            dataset = load_dataset(cfg.pretrain.data, cfg.env)
        if dataset is not None:
            filled = fill_replay(self.replay, dataset.episodes)
            left = filled["left_out"]
            print(f"[reverie] dataset {dataset.source}: {dataset.describe()}; replay filled with {filled['steps']} "
                  f"steps, {filled['rows_per_column']} rows in each of {self.replay.num_envs} env column(s)"
                  + (f" (the last {left} rows left out: the columns take equal pieces)" if left else ""))

    def _restore(self, saved: dict) -> None:
        """Resume: the agent, the replay as saved, the envs where they pickle (else their episodes restart), and
        the loop state (counters, clocks, schedule, RNG states: restored last)."""
        self.agent.load_state_dict(saved["agent"])
        ranks.check_digest(self.agent, saved.get("agent_digest"), self.info)  # ranks > 0 saved their digest
        self.replay.load(saved["replay_dir"])
        if self.stepper.load_state_dict(saved["stepper"]):  # envs restored exactly: continue the episodes in flight
            self.row, self.act_state = saved["row"], saved["act_state"]
        self.loop.load_state_dict(saved)
        why = (saved["stepper"] or {}).get("env_error")  # e.g. Atari with sticky actions (pretrain: no envs)
        if self.info.is_main:  # data parallel: rank 0 speaks for the run
            print(f"[reverie] resumed {self.run_dir} from {Path(saved['checkpoint_path']).name}: env step "
                  f"{self.loop.env_steps}, {self.loop.updates} updates, replay {len(self.replay)} steps"
                  f"{'' if self.row is not None or self.offline else '; episodes in flight restart'}"
                  f"{'' if self.row is not None or not why else f' (the envs were not saved: {why})'}")
