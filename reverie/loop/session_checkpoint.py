"""The two checkpoint payloads of a :class:`reverie.loop.session.Session`: the run's own (what a resume needs, each
rank its own) and ``best.pt``'s (the weights of the best evaluation, what ``load_run`` reads)."""

from __future__ import annotations

from typing import Any

import torch
from omegaconf import OmegaConf

from reverie.runtime import collectives
from reverie.state import ranks
from reverie.state.checkpoint import save_checkpoint


class SessionCheckpoint:
    """The checkpoint steps of :class:`reverie.loop.session.Session`."""

    def checkpoint(self) -> None:
        """Save the run (atomically, keeping ``train.checkpoint_keep``): rank 0 the agent and its own state, ranks
        > 0 their state and the agent's digest (:meth:`checkpoint_payload`, with this rank's replay snapshot)."""
        save_checkpoint(ranks.checkpoint_dir(self.run_dir, self.info), self.step, self.checkpoint_payload(),
                        keep=self.keep, replay=self.replay)

    def checkpoint_payload(self) -> dict[str, Any]:
        """What a resume needs besides the replay (ranks > 0 keep the agent's digest instead of its state)."""
        info = self.info
        return {"agent": self.agent.state_dict() if info.is_main else None,
                "agent_digest": None if info.is_main else collectives.param_digest(self.agent),
                "obs_shapes": self.obs_shapes, "action_spec": self.spec,
                "config": OmegaConf.to_container(self.cfg, resolve=True), **self.loop.state_dict(self.repeat),
                "stepper": self.stepper.state_dict(), "row": self.row, "act_state": self.act_state,
                "wandb_id": self.logger.wandb_run_id}

    def best_payload(self, eval_return: float) -> dict[str, Any]:
        """``best.pt``'s payload after an evaluation that beat every earlier one (module weights, no optimiser)."""
        loop = self.loop
        return {"agent": torch.nn.Module.state_dict(self.agent) if isinstance(self.agent, torch.nn.Module)
                else self.agent.state_dict(), "obs_shapes": self.obs_shapes, "action_spec": self.spec,
                "config": OmegaConf.to_container(self.cfg, resolve=True),
                "counters": {"env_steps": loop.env_steps, "updates": loop.updates,
                             "frames": loop.env_steps * self.repeat},
                "eval_return": eval_return, "eval_episodes": self.eval_episodes}
