"""reverie.models.dynamics.base.rollout: the stacked feature keys and actions, and what it keeps while it runs."""

import gc
import weakref

import torch

from reverie.models.dynamics.base import rollout

N, H = 3, 4


def img_step(state, action):
    """A made-up step: deter grows by the action, stoch and logits (not a feature key) are fresh tensors."""
    deter = state["deter"] + action
    return {"deter": deter, "stoch": deter * 2, "logits": torch.full((N, 1000), float(deter[0, 0]))}


def test_rollout_stacks_the_feature_keys_and_frees_the_rest_as_it_goes():
    start = {"deter": torch.zeros(N, 2), "stoch": torch.zeros(N, 2), "logits": torch.zeros(N, 1000)}
    seen, alive_logits = [], []

    def policy(state):
        gc.collect()
        # every earlier imagined step's logits must be gone by now (the start's are the caller's)
        alive_logits.append(sum(ref() is not None for ref in seen[1:-1]))
        seen.append(weakref.ref(state["logits"]))
        return torch.ones(N, 2)

    stacked, actions = rollout(img_step, policy, start, H, ("deter", "stoch"))
    assert alive_logits == [0] * (H + 1)  # the older code kept every state: 0, 0, 0, 1, 2
    assert set(stacked) == {"deter", "stoch"}
    expected = torch.arange(H + 1, dtype=torch.float32)[:, None, None].expand(H + 1, N, 2)  # deter_t = t
    assert torch.equal(stacked["deter"], expected)
    assert torch.equal(stacked["stoch"], 2 * expected)
    assert actions.shape == (H + 1, N, 2)
