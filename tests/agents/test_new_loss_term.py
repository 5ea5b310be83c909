"""Adding one world-model loss term (issue 46 item 7): the term and its loss key live in this file, the scale in the
config; nothing in reverie changes. The dynamics' ``loss`` returns the new key, ``loss_keys`` declares it,
``agent.module.loss_scales.<key>`` scales it (a missing scale is an error before anything is written), and the
term's gradient reaches the model: a large scale drives it down, against the same run at scale 0."""

import json

import torch

from reverie.cli import main
from reverie.models.dynamics import CategoricalRSSM


class DeterL2RSSM(CategoricalRSSM):
    """The categorical RSSM plus ``deter_l2``: the mean square of the posterior's deterministic state ``(T, B)``."""

    loss_keys = ("dyn", "rep", "deter_l2")

    def loss(self, post, prior, prev_action, is_first):
        losses, info = super().loss(post, prior, prev_action, is_first)
        return losses | {"deter_l2": post["deter"].pow(2).mean(-1)}, info


def train(run_dir, *overrides) -> list[dict]:
    assert main(["train", "exp=debug", f"run_dir={run_dir}", "train.steps=160", "train.eval_every=0",
                 "train.log_every=16", f"agent.module.dynamics._target_={__name__}.DeterL2RSSM", *overrides]) == 0
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_loss_term_defined_in_a_test_file_trains_through_the_cli_with_its_scale(tmp_path):
    torch.manual_seed(0)
    pressed = train(tmp_path / "pressed", "+agent.module.loss_scales.deter_l2=30.0")
    free = train(tmp_path / "free", "+agent.module.loss_scales.deter_l2=0.0")
    pressed_l2 = [r["loss/deter_l2"] for r in pressed if "loss/deter_l2" in r]
    free_l2 = [r["loss/deter_l2"] for r in free if "loss/deter_l2" in r]
    assert len(pressed_l2) >= 3 and len(free_l2) == len(pressed_l2)  # logged under its own key
    assert pressed_l2[-1] < 0.5 * free_l2[-1]  # its gradient reaches the dynamics; at scale 0 it does not


def test_a_loss_term_without_a_scale_or_a_scale_of_no_loss_is_refused_before_anything_is_written(tmp_path,
                                                                                                  capsys):
    run_dir = tmp_path / "unscaled"
    assert main(["train", "exp=debug", f"run_dir={run_dir}",
                 f"agent.module.dynamics._target_={__name__}.DeterL2RSSM"]) == 2
    assert "no scale for the losses ['deter_l2']: set agent.module.loss_scales.deter_l2" in capsys.readouterr().err
    assert main(["train", "exp=debug", f"run_dir={run_dir}", "+agent.module.loss_scales.deter_l2=1.0"]) == 2
    assert "keys ['deter_l2'] are not losses of this agent" in capsys.readouterr().err  # the plain RSSM has none
    assert not run_dir.exists()
