"""``reverie play`` in a real browser: headless Chromium (Debian's package, driven by Playwright) on a run trained
here; keys step both panes, and the predicted rewards the page shows are the world model's for those actions.

Skips only where /usr/bin/chromium is missing outside CI (`make sysdeps` installs it as root); in CI (``CI`` set)
a missing browser fails the test.
"""

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.play_process import PlayProcess

from reverie.cli import main
from reverie.envs import make_env
from reverie.loop.evaluate import EVAL_SEED_OFFSET
from reverie.state.saved_run import load_run

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def need_chromium():
    if CHROMIUM.exists():
        return
    if os.environ.get("CI"):
        pytest.fail(f"{CHROMIUM} is missing in CI: `make sysdeps` (as root) installs Debian's chromium package")
    pytest.skip(f"headless Chromium is not installed at {CHROMIUM}: `make sysdeps` (as root) or "
                f"`apt-get install chromium` installs it")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    need_chromium()
    run_dir = tmp_path_factory.mktemp("play") / "run"
    assert main(["train", "exp=debug", f"run_dir={run_dir}", "train.steps=64", "train.eval_episodes=1"]) == 0
    return run_dir


@pytest.fixture(scope="module")
def address(run_dir):
    """``reverie play RUN --port 0`` in a subprocess; yields the address it prints."""
    play = PlayProcess(run_dir)
    try:
        address = play.address(180)
        if address is None:
            pytest.fail(f"reverie play printed no address within 180 s:\n{play.output()}")
        yield address
    finally:
        play.process.terminate()
        play.process.wait(30)
        play.close()


@torch.no_grad()
def predicted_rewards(run_dir, actions, from_real):
    """The run's world model, on its own: rewards predicted along ``actions`` (indices) from the posterior of the
    play env's first observation (``from_real``) or from the initial state; latents' mode."""
    run = load_run(run_dir)
    wm, dim = run.agent.wm, run.action_spec.dim
    if from_real:
        obs, _ = make_env(run.config["env"], run.config["seed"] + EVAL_SEED_OFFSET).reset()
        data = wm.tensors({k: np.asarray(obs[k])[None, None] for k in wm.obs_shapes})  # (1, 1, ...)
        post, _ = wm.dynamics.observe(wm.encode(data), torch.zeros(1, 1, dim), torch.ones(1, 1, dtype=torch.bool),
                                      None, sample=False)
        state = {k: v[0] for k, v in post.items()}
    else:
        state = wm.dynamics.initial(1)
    rewards = []
    for a in actions:
        state = wm.dynamics.img_step(state, torch.eye(dim)[[a]], sample=False)
        rewards.append(float(wm.reward(wm.dynamics.features(state)).mean[0]))
    return rewards


def table(page, column):
    """The step table's ``column`` values (data-value), oldest step first."""
    values = page.eval_on_selector_all("#steps tbody tr", f"rows => rows.map(r => r.cells[{column}].dataset.value)")
    return values[::-1]


def wait_steps(page, real, dream):
    page.wait_for_function(f"document.getElementById('real-step').textContent === '{real}' && "
                           f"document.getElementById('dream-step').textContent === '{dream}'", timeout=60_000)


def test_keys_step_both_panes_and_the_page_shows_the_model_rewards(run_dir, address):
    from playwright.sync_api import sync_playwright

    need_chromium()
    keys = ["ArrowRight", "ArrowRight", "ArrowLeft", "1", "0"]  # CartPole Discrete(2): arrows and digits
    actions = [1, 1, 0, 1, 0]
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            errors = []
            page.on("pageerror", lambda err: errors.append(str(err)))
            page.on("response", lambda r: errors.append(f"{r.status} {r.url}") if r.status >= 400 else None)
            page.goto(address)
            page.wait_for_selector("body[data-ready='1']")
            wait_steps(page, 0, 0)
            assert page.is_visible("#real-images img")  # CartPole's render in the real pane
            real, dream = page.locator("#real-pane").bounding_box(), page.locator("#dream-pane").bounding_box()
            assert real["y"] == dream["y"] and real["x"] + real["width"] < dream["x"]  # side by side at 1280 px
            for key in keys:
                page.keyboard.press(key)
            wait_steps(page, 5, 5)
            assert table(page, 0) == ["1", "2", "3", "4", "5"]
            assert table(page, 1) == [str(a) for a in actions]
            assert [float(v) for v in table(page, 2)] == [1.0] * 5  # CartPole's true reward
            np.testing.assert_allclose([float(v) for v in table(page, 3)], predicted_rewards(run_dir, actions, True),
                                       rtol=0, atol=1e-6)
            assert float(page.get_attribute("#dream-reward", "data-value")) == float(table(page, 3)[-1])
            # CartPole's 4 features, reward, continue and the latent agreement (cosine of dream and real features)
            assert page.locator("#plots canvas").count() == 4 + 3

            page.select_option("#dream-start", "initial")  # the dream restarts from the model's initial state
            wait_steps(page, 5, 0)
            for key in ("ArrowLeft", "ArrowRight"):
                page.keyboard.press(key)
            wait_steps(page, 7, 2)
            np.testing.assert_allclose([float(v) for v in table(page, 3)[-2:]],
                                       predicted_rewards(run_dir, [0, 1], False), rtol=0, atol=1e-6)

            page.click("#reset")
            wait_steps(page, 0, 0)
            assert page.text_content("#real-return") == "0.000"
            page.select_option("#driver", "policy")  # watch: the policy steps both panes on its own
            page.wait_for_function("Number(document.getElementById('real-step').textContent) >= 3", timeout=60_000)
            page.select_option("#driver", "person")
            page.wait_for_timeout(500)  # a policy step in flight lands
            assert page.text_content("#real-step") == page.text_content("#dream-step")
            assert errors == []
        finally:
            browser.close()
