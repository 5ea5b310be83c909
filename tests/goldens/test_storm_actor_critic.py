"""STORM's actor-critic update, tensor by tensor against STORM's own code (issue 44 item 3).

The golden (tests/goldens/data/storm1c50658_actor_critic.npz) was made by STORM's ``agents.py``
``ActorCriticAgent.update`` at weipu-zhang/STORM 1c50658 (bench/storm_goldens.py; its ``meta`` holds the command):
two updates on two imagined batches from perturbed parameters. Here :class:`reverie.agents.storm.StormActorCritic`
starts from the same parameters and must give STORM's logged losses, return scale, gradients (before clipping),
gradient norm, return-normaliser EMAs and parameters after each update. Counter-checks: DreamerV3's lambda-return,
interpolated percentiles, a critic regularised towards the slow values instead of the slow return, or a policy loss
weighted by the continuation before each step (DreamerV3's) each fail.
"""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from reverie.agents import objectives, storm
from reverie.agents.returns import ReturnNormalizer

GOLDEN = Path(__file__).parent / "data" / "storm1c50658_actor_critic.npz"
LOGS = {"policy_loss": "loss/policy", "value_loss": "loss/value", "entropy_loss": "actor/entropy",
        "S": "return/S", "norm_ratio": "return/scale", "total_loss": "loss/total"}


def golden() -> dict[str, np.ndarray]:
    with np.load(GOLDEN) as f:
        return {k: f[k] for k in f.files}


def time_first(data: dict[str, np.ndarray], u: int) -> tuple[torch.Tensor, ...]:
    """STORM's batch-first ``(B, L, ...)`` batch as reverie's time-first ``(L, B, ...)`` tensors."""
    latent, action, reward, term = (torch.as_tensor(data[f"batch{u}/{k}"]).transpose(0, 1)
                                    for k in ("latent", "action", "reward", "termination"))
    return latent, action, reward, term


def run_updates(data, monkeypatch) -> list[dict]:
    """Both updates from the golden's initial parameters: per update, metrics, grads, norm, EMAs, parameters."""
    meta = json.loads(str(data["meta"]))
    torch.manual_seed(0)
    agent = storm.StormActorCritic(meta["feat"], meta["actions"], units=meta["units"], layers=meta["layers"],
                                   gamma=meta["gamma"], lam=meta["lambda"], entropy=meta["entropy_coef"])
    init = {k[len("init/"):]: torch.as_tensor(v) for k, v in data.items() if k.startswith("init/")}
    missing, unexpected = agent.load_state_dict(init, strict=False)
    assert not unexpected and set(missing) == {"retnorm.low", "retnorm.high"}
    names = {p: n for n, p in agent.named_parameters()}
    clip, grads = torch.nn.utils.clip_grad_norm_, {}

    def recording_clip(params, max_norm, *a, **k):
        params = list(params)
        grads.update({names[p]: p.grad.detach().clone() for p in params if p.grad is not None})
        return clip(params, max_norm, *a, **k)

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", recording_clip)
    out = []
    for u in (1, 2):
        grads.clear()
        metrics, skipped = agent.update(*time_first(data, u))
        assert skipped == 0
        out.append({"metrics": metrics, "grads": dict(grads), "params": {k: v.clone() for k, v in
                                                                        agent.state_dict().items()},
                    "ema": torch.stack([agent.retnorm.low, agent.retnorm.high])})
    return out


def compare(data, results) -> None:
    for u, got in zip((1, 2), results):
        for tag, key in LOGS.items():
            np.testing.assert_allclose(float(got["metrics"][key]), float(data[f"log{u}/{tag}"]), rtol=2e-5,
                                       atol=1e-6, err_msg=f"update {u} {tag}")
        np.testing.assert_allclose(float(got["metrics"]["grad_norm/total"]), float(data[f"norm{u}"]), rtol=2e-5)
        np.testing.assert_allclose(got["ema"].numpy(), data[f"ema{u}"], rtol=2e-5, atol=1e-6)
        want = {k[len(f"grad{u}/"):]: v for k, v in data.items() if k.startswith(f"grad{u}/")}
        assert set(got["grads"]) == set(want) and len(want) == 16  # actor and critic, 8 tensors each
        scale = max(float(np.abs(v).max()) for v in want.values())
        for name, g in want.items():
            np.testing.assert_allclose(got["grads"][name].numpy(), g, rtol=0, atol=3e-5 * scale,
                                       err_msg=f"update {u} grad {name}")
        for name, p in ((k[len(f"param{u}/"):], v) for k, v in data.items() if k.startswith(f"param{u}/")):
            np.testing.assert_allclose(got["params"][name].numpy(), p, rtol=1e-6, atol=2e-6,
                                       err_msg=f"update {u} param {name}")


def test_two_updates_equal_storms_own(monkeypatch):
    data = golden()
    compare(data, run_updates(data, monkeypatch))


def dreamer_alignment(reward, value, termination, gamma, lam):
    """DreamerV3's recursion (bootstrapping from v_{t+1}) in STORM's layout."""
    cont = 1.0 - termination
    returns = [value[-1]]
    for t in range(reward.shape[0] - 1, -1, -1):
        returns.append(reward[t] + gamma * cont[t] * ((1.0 - lam) * value[t + 1] + lam * returns[-1]))
    return torch.stack(returns[1:][::-1])


@pytest.mark.parametrize("change", ["dreamer lambda-return", "interpolated percentiles", "slow values as target",
                                    "policy loss weighted by continuation"])
def test_each_storm_detail_is_seen_by_the_check(change, monkeypatch):
    data = golden()
    if change == "policy loss weighted by continuation":  # DreamerV3's weights: the product of the continues before t
        assert all(data[f"batch{u}/termination"][:, :-1].any() for u in (1, 2))  # terminations that change a weight
        real_return, real_policy_loss, seen = objectives.storm_lambda_return, objectives.reinforce_policy_loss, {}

        def recording_return(reward, value, termination, gamma, lam):
            seen["cont"] = 1.0 - termination  # (T, N)
            return real_return(reward, value, termination, gamma, lam)

        def weighted_policy_loss(log_prob, adv, entropy, weight, entropy_scale):
            cont = seen["cont"]
            before = torch.cat([torch.ones_like(cont[:1]), torch.cumprod(cont[:-1], 0)])
            return real_policy_loss(log_prob, adv, entropy, weight * before, entropy_scale)

        monkeypatch.setattr(objectives, "storm_lambda_return", recording_return)
        monkeypatch.setattr(objectives, "reinforce_policy_loss", weighted_policy_loss)
    elif change == "dreamer lambda-return":
        monkeypatch.setattr(objectives, "storm_lambda_return", dreamer_alignment)
    elif change == "interpolated percentiles":
        monkeypatch.setattr(storm.KthReturnNormalizer, "_quantiles", ReturnNormalizer._quantiles)
    else:
        real = objectives.storm_lambda_return
        calls = []

        def slow_values(reward, value, termination, gamma, lam):  # the second call is the slow critic's
            calls.append(1)
            return value[:-1] if len(calls) % 2 == 0 else real(reward, value, termination, gamma, lam)

        monkeypatch.setattr(objectives, "storm_lambda_return", slow_values)
    with pytest.raises(AssertionError):
        compare(data, run_updates(data, monkeypatch))
