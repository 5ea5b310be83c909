"""The two-hot output layers (reward and critic, 255 bins) compute in float32 under bf16 autocast (issue 41).

Why: the expected value of the bins moves with every rounding of the logits; on a CartPole critic whose values reach
about 100 the bf16 logits alone put an error of about 1% on the value, a quarter of the advantages' spread
(docs/dreamerv3.md, "bf16 and the two-hot heads"). Checked here with a head whose logits are large, as a trained
critic's are: the value under bf16 autocast equals the value from float32 output logits given the same bf16 hidden
activations (to float32 rounding), and the counter-check, the same head with its output layer left in bf16, is off by
far more.
"""

import pytest
import torch

from reverie.agents import DreamerV3, DreamerV3_2025
from reverie.models.distributions import TwoHotSymlog
from reverie.models.networks import MLP
from reverie.models.rms_mlp import RMSMLP
from reverie.runtime.precision import float32_linear
from reverie.types import ActionSpec


def test_float32_linear_by_hand_under_bf16_autocast():
    layer = torch.nn.Linear(3, 2)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[1.0, 2.0, 3.0], [0.5, -1.0, 0.25]]))
        layer.bias.copy_(torch.tensor([0.125, -0.5]))
    x = torch.tensor([[1.0 / 3.0, 7.0, -2.0]])  # 1/3 is not a bf16 number: the float32 input keeps it
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = float32_linear(layer, x)
        rounded = layer(x)
    assert out.dtype == torch.float32 and rounded.dtype == torch.bfloat16
    want = torch.tensor([[1 / 3 + 14 - 6 + 0.125, 1 / 6 - 7 - 0.5 - 0.5]])  # written out
    torch.testing.assert_close(out, want, rtol=1e-6, atol=0)
    assert (rounded.float() - want).abs().max() > 1e-3  # bf16: 8.458 is stored as 8.4375


@pytest.mark.parametrize("cls", [MLP, RMSMLP])
def test_a_two_hot_head_keeps_its_value_under_bf16(cls):
    torch.manual_seed(0)
    kwargs = dict(out_scale=1.0) if cls is MLP else dict(outscale=1.0)
    head = cls(64, 255, 128, 2, float32_out=True, **kwargs) if cls is RMSMLP else \
        cls(64, 255, units=128, layers=2, float32_out=True, **kwargs)
    with torch.no_grad():
        head.out.weight.mul_(40.0)  # logits spread over tens of nats, as a trained critic's (-56 .. 26 measured)
    feat = torch.randn(512, 64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        value = TwoHotSymlog(head(feat)).mean
        hidden = head.hidden(feat)
        bf16_out = TwoHotSymlog(head.out(hidden)).mean  # the counter-check: output layer in bf16
    exact = TwoHotSymlog(head.out(hidden.float())).mean  # float32 logits from the same bf16 hidden activations
    torch.testing.assert_close(value, exact, rtol=1e-5, atol=1e-5)
    assert (bf16_out - exact).abs().max() > 100 * (value - exact).abs().max().clamp_min(1e-6)


@pytest.mark.parametrize("agent_cls", [DreamerV3, DreamerV3_2025])
def test_both_agents_build_their_two_hot_heads_with_float32_outputs(agent_cls):
    spec = ActionSpec(discrete=True, dim=2)
    small = dict(units=32) if agent_cls is DreamerV3_2025 else dict(units=32, layers=1)
    agent = agent_cls({"vector": (4,)}, spec, **small)
    assert agent.critic.float32_out and agent.wm.reward_head.float32_out
    assert not agent.wm.cont_head.float32_out  # one logit of a Bernoulli: nothing to move
