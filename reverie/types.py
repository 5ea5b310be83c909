"""The data contract shared by envs, replay, models, agents and the training loop.

Observations are dicts of numpy arrays (one env) or of batched arrays (``N`` envs):

- ``image``: uint8 ``(3, 64, 64)`` (channel-first, converted once in the env layer). Any key whose value
  has 3 dims and dtype uint8 is an image key.
- ``vector``: float32 ``(F,)``.
- every step also carries ``reward`` (float32), ``is_first``, ``is_last``, ``is_terminal`` (bool).

Flags:

- ``is_terminal``: the MDP ended (Gymnasium ``terminated``). The continue target is ``1 - is_terminal``.
- ``is_last``: the episode ended for any reason (terminated or truncated). A time limit sets only is_last.
- ``is_first``: first step of an episode; its reward is 0 and the previous action fed to the model is 0.

Timing diagram of replay row ``t`` (time-first)::

    row t:  obs_t  reward_t (received on arriving at obs_t)  is_first_t  is_last_t  is_terminal_t  action_t
    model:  h_t = f(h_{t-1}, z_{t-1}, prev_action_t)     with prev_action_t = action_{t-1}, 0 where is_first_t
            z_t ~ q(z_t | h_t, obs_t);   reward head at (h_t, z_t) predicts reward_t;
            continue head at (h_t, z_t) predicts 1 - is_terminal_t

    env call k:       obs_k, reward_k, flags_k  --agent.act-->  action_k  --replay.add(row k)-->  env.step(action_k)
    episode end:      the row with is_last holds the TRUE final observation; its action is ignored by the env,
                      the next call returns the reset observation as a row with is_first (reward 0).

Actions in the model are float32 ``(A,)``: a one-hot vector for ``Discrete(A)`` spaces, values in
``[-1, 1]`` for ``Box`` spaces (rescaled to the env's bounds by the env layer).

Dimension letters: ``T`` sequence length, ``B`` batch, ``N`` parallel envs, ``H`` imagination horizon,
``D`` deterministic state, ``S x K`` categorical latents (groups x classes), ``Z`` Gaussian latent size,
``A`` action dims. Image sizes are written literally, e.g. ``(3, 64, 64)``. Time-first everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: Keys every replay row carries besides the observation keys.
FLAG_KEYS = ("is_first", "is_last", "is_terminal")
STEP_KEYS = ("reward", *FLAG_KEYS, "action")


def is_image_key(value: np.ndarray | tuple, dtype=None) -> bool:
    """True for image observations: 3 dims (C, H, W) and uint8."""
    if isinstance(value, tuple):
        return len(value) == 3 and np.dtype(dtype) == np.uint8
    return value.ndim == 3 and value.dtype == np.uint8


@dataclass(frozen=True)
class ActionSpec:
    """What the agent needs to know about the action space.

    Attributes:
        discrete: True for ``Discrete(n)`` spaces (the agent emits one-hot vectors of size ``dim``),
            False for ``Box`` spaces (the agent emits values in ``[-1, 1]``, shape ``(dim,)``).
        dim: ``A``, the size of the action vector.
    """

    discrete: bool
    dim: int
