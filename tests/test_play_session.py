"""``reverie play`` without a browser: key maps per action space, and the session on image runs (its dream
against the world model's own numbers), on Atari and through the HTTP routes."""

import base64
import io
from pathlib import Path

import imageio.v3 as iio
import numpy as np
import pytest
import torch
from helpers.agents import dreamer
from omegaconf import OmegaConf

from reverie.agents.dreamer import DreamerV3
from reverie.play.keymap import KeyMap
from reverie.play.session import PlaySession, StepRefused
from reverie.types import ActionSpec

CONFIGS = Path(__file__).resolve().parents[1] / "reverie" / "configs" / "env"
FULL = ["NOOP", "FIRE", "UP", "RIGHT", "LEFT", "DOWN", "UPRIGHT", "UPLEFT", "DOWNRIGHT", "DOWNLEFT", "UPFIRE",
        "RIGHTFIRE", "LEFTFIRE", "DOWNFIRE", "UPRIGHTFIRE", "UPLEFTFIRE", "DOWNRIGHTFIRE", "DOWNLEFTFIRE"]


def test_atari_keys_press_the_joystick_meaning():
    keys = KeyMap.for_env(ActionSpec(True, 18), FULL)
    assert keys.action(["ArrowUp"]) == FULL.index("UP")
    assert keys.action(["ArrowUp", " "]) == FULL.index("UPFIRE")
    assert keys.action([" ", "ArrowUp", "ArrowLeft"]) == FULL.index("UPLEFTFIRE")
    assert keys.action(["n"]) == FULL.index("NOOP")
    assert keys.action(["x"]) is None
    breakout = KeyMap.for_env(ActionSpec(True, 4), ["NOOP", "FIRE", "RIGHT", "LEFT"])
    assert breakout.action(["ArrowRight"]) == 2 and breakout.action([" "]) == 1
    assert breakout.action(["ArrowLeft", " "]) in (1, 3)  # no LEFTFIRE: a meaning sharing one part
    assert breakout.action(["ArrowUp"]) == 0  # no UP in Breakout: NOOP (nothing shared, nothing extra)
    assert breakout.label(3) == "LEFT"


def test_discrete_and_box_keys():
    two = KeyMap.for_env(ActionSpec(True, 2))
    assert (two.action(["ArrowLeft"]), two.action(["ArrowRight"]), two.action(["1"])) == (0, 1, 1)
    assert two.action(["ArrowLeft", "ArrowRight"]) == 1  # the last key pressed wins
    three = KeyMap.for_env(ActionSpec(True, 3))
    assert [three.action([k]) for k in ("ArrowLeft", "ArrowDown", "ArrowRight", "2")] == [0, 1, 2, 2]
    many = KeyMap.for_env(ActionSpec(True, 12))
    assert many.action(["9"]) == 9 and many.action(["b"]) == 11 and "ArrowLeft" not in many.keys
    box = KeyMap.for_env(ActionSpec(False, 3))
    np.testing.assert_array_equal(box.action(["ArrowRight", "ArrowDown", "a"]), [1.0, -1.0, -1.0])
    np.testing.assert_array_equal(box.action(["ArrowLeft", "ArrowRight"]), [0.0, 0.0, 0.0])
    np.testing.assert_array_equal(box.action([" "]), [0.0, 0.0, 0.0])
    assert box.label(np.array([1.0, -0.5, 0.0])) == "[+1.00, -0.50, +0.00]"
    big = KeyMap.for_env(ActionSpec(False, 7))
    assert big.keys == [] and big.action(["ArrowLeft"]) is None and "watch" in big.help[0][1]


def image_agent(actions=2):
    torch.manual_seed(0)
    return DreamerV3({"image": (3, 16, 16), "vector": (2,)}, ActionSpec(True, actions),
                     **dreamer(deter=16, units=16, cnn_depth=4))


def decode_png(uri):
    return iio.imread(io.BytesIO(base64.b64decode(uri.split(",", 1)[1])))


@torch.no_grad()
def dream_rewards(wm, start, actions):
    """The world model's predicted rewards along ``actions`` (indices) from ``start`` ``(1, ...)``, latents' mode."""
    out, state = [], start
    for a in actions:
        state = wm.dynamics.img_step(state, torch.eye(2)[[a]], sample=False)
        out.append(float(wm.reward(wm.dynamics.features(state)).mean[0]))
    return out


def test_session_on_an_image_run_matches_the_world_model():
    agent = image_agent()
    env = {"id": "reverie.envs.testing.ImageCountingEnv", "kwargs": {"length": 4, "size": 16, "dict_obs": True,
                                                                      "obs_dim": 2}}
    session = PlaySession(agent, env, ActionSpec(True, 2), seed=0)
    assert not session.render  # the env takes no render_mode: the observation images are shown instead
    snap = session.snapshot()
    real = decode_png(snap["real"]["images"]["image"])
    assert real.shape == (256, 256, 3)  # 16 x 16 upscaled 16x, nearest neighbour: the observation's pixels
    np.testing.assert_array_equal(real[::16, ::16], np.moveaxis(session.obs["image"], 0, -1))
    assert decode_png(snap["dream"]["images"]["image"]).shape == (256, 256, 3)
    assert snap["vector_keys"] == ["vector"] and snap["real"]["frame"] is None
    start = {k: v.clone() for k, v in session.dream.items()}
    for keys in (["ArrowRight"], ["ArrowLeft"], ["1"]):
        session.step(session.keymap.action(keys))
    snap = session.snapshot()
    assert (snap["real"]["step"], snap["dream"]["step"]) == (3, 3)
    assert snap["history"]["true_reward"] == [1.0, 2.0, 3.0]  # CountingEnv pays the step index
    assert snap["history"]["action"] == ["1", "0", "1"]
    np.testing.assert_allclose(snap["history"]["pred_reward"], dream_rewards(agent.wm, start, [1, 0, 1]), rtol=0,
                               atol=1e-6)
    assert len(snap["history"]["dream_obs"][-1]["vector"]) == 2
    session.set_modes(dream_start="initial")  # the dream restarts from the model's initial state
    assert (session.real_step, session.dream_step) == (3, 0)
    session.step(0)  # the 4th step ends the episode
    expected = dream_rewards(agent.wm, agent.wm.dynamics.initial(1), [0])[0]
    np.testing.assert_allclose(session.dream_out["reward"], expected, rtol=0, atol=1e-6)
    assert session.done and session.real_return == 10.0
    with pytest.raises(StepRefused, match="press reset"):
        session.step(0)
    session.reset()
    assert (session.real_step, session.dream_step, session.done, session.history["step"]) == (0, 0, False, [])
    with pytest.raises(ValueError, match="driver must be one of"):
        session.set_modes(driver="robot")
    session.set_modes(driver="policy")
    session.step(session.policy_action())
    session.step(session.policy_action())  # the policy acts from the filter's state after its own first step
    assert session.real_step == 2


def test_session_on_atari_uses_the_minimal_action_meanings():
    pytest.importorskip("ale_py")
    cfg = OmegaConf.load(CONFIGS / "atari100k.yaml")
    cfg.task = "breakout"
    torch.manual_seed(0)
    agent = DreamerV3({"image": (3, 64, 64)}, ActionSpec(True, 4), **dreamer(deter=16, units=16, cnn_depth=4))
    session = PlaySession(agent, cfg, ActionSpec(True, 4), seed=0)
    assert session.keymap.labels == ["NOOP", "FIRE", "RIGHT", "LEFT"]
    session.step(session.keymap.action([" "]))
    snap = session.snapshot()
    assert snap["history"]["action"] == ["FIRE"] and snap["real"]["frame"] is not None  # ALE renders rgb_array
    assert decode_png(snap["dream"]["images"]["image"]).shape == (256, 256, 3)


def test_http_routes(monkeypatch):
    """The routes through uvicorn on a free port (a thread), requests from the standard library; the env is built
    and stepped on one thread only (an OpenGL simulator such as dm_control's EGL renders on its context's thread)."""
    import json
    import threading
    import urllib.error
    import urllib.request

    import uvicorn

    from reverie.envs.testing import CountingEnv
    from reverie.play.server import bind, create_app

    env_threads = set()
    for name in ("__init__", "reset", "step"):
        def record(*args, _method=getattr(CountingEnv, name), **kwargs):
            env_threads.add(threading.get_ident())
            return _method(*args, **kwargs)
        monkeypatch.setattr(CountingEnv, name, record)
    env = {"id": "reverie.envs.testing.CountingEnv", "kwargs": {"length": 3, "obs_dim": 2, "discrete": False}}
    torch.manual_seed(0)
    agent = DreamerV3({"vector": (2,)}, ActionSpec(False, 1), **dreamer(deter=16, units=16))
    sock = bind("127.0.0.1", 0)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    app = create_app(lambda: PlaySession(agent, env, ActionSpec(False, 1), seed=0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()

    def request(path, body=None):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url + path, data=data, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30) as response:
                text = response.read().decode()
                return response.status, json.loads(text) if path.startswith("/api") else text
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read().decode())

    try:
        for _ in range(100):
            if server.started:
                break
            threading.Event().wait(0.1)
        assert "Real environment" in request("/")[1]
        assert request("/static/play.js")[0] == 200
        assert request("/api/state")[1]["keymap"]["help"][0] == ["ArrowLeft / ArrowRight", "a[0] = -1 / +1"]
        status, snap = request("/api/step", {"keys": ["ArrowRight"]})
        assert status == 200 and snap["real"]["step"] == 1 and snap["history"]["action"] == ["[+1.00]"]
        assert request("/api/step", {"keys": ["q"]}) == (400, {"detail": "no action is bound to keys ['q']"})
        assert request("/api/mode", {"dream_start": "dreamland"})[0] == 400
        assert request("/api/step", {"policy": True})[1]["real"]["step"] == 2
        assert request("/api/step", {"keys": [" "]})[1]["real"]["done"] is True
        assert request("/api/step", {"keys": [" "]}) == (409, {"detail": "the real episode is over: press reset"})
        assert request("/api/dream", {})[1]["dream"]["step"] == 0
        assert request("/api/reset", {})[1]["real"]["step"] == 0
        assert app.state.session.real_step == 0
        assert len(env_threads) == 1 and threading.get_ident() not in env_threads  # the session's own thread
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def test_play_reports_bad_ports_and_hosts_before_loading_the_run(tmp_path, capsys):
    """No traceback and no model load: the port's range at parsing, a taken port or a foreign --host at once."""
    from reverie.cli import main
    from reverie.play.server import bind

    missing = str(tmp_path / "no_run")  # never reached: the address is checked first
    for port in ("99999", "-1", "abc"):
        with pytest.raises(SystemExit) as exit_info:
            main(["play", missing, "--port", port])
        assert exit_info.value.code == 2
        assert f"--port: must be a port number 0-65535 (0: any free port), got '{port}'" in capsys.readouterr().err
    taken = bind("127.0.0.1", 0)
    try:
        assert main(["play", missing, "--port", str(taken.getsockname()[1])]) == 2
        err = capsys.readouterr().err
        assert "Address already in use" in err and err.rstrip().endswith("pick another --port (0: any free one)")
    finally:
        taken.close()
    assert main(["play", missing, "--host", "192.0.2.1", "--port", "0"]) == 2  # TEST-NET-1: not this machine's
    err = capsys.readouterr().err
    assert err.startswith("play error: cannot listen on 192.0.2.1:0")
    assert "--host must be an address of this machine" in err


@pytest.mark.parametrize("stop", ["SIGINT", "SIGTERM"])
def test_play_stops_quietly_on_ctrl_c_and_sigterm(tmp_path_factory, stop):
    """``reverie play`` in a subprocess on a run trained here: Ctrl-C (SIGINT) or SIGTERM (what ``kill``, systemd
    and container runtimes send) ends it with exit code 0 and one line, not a traceback or -15."""
    import signal
    import urllib.request

    from helpers.play_process import PlayProcess

    from reverie.cli import main

    run_dir = tmp_path_factory.getbasetemp() / "play_stop_run"
    if not run_dir.exists():
        assert main(["train", "exp=debug", f"run_dir={run_dir}", "train.steps=32", "train.eval_episodes=1"]) == 0
    play = PlayProcess(run_dir)
    try:
        address = play.address(180)
        assert address is not None, play.output()
        with urllib.request.urlopen(address, timeout=60) as page:
            assert page.status == 200  # serving: uvicorn has taken over the signals
        play.process.send_signal(getattr(signal, stop))
        assert play.process.wait(60) == 0, play.output()
    finally:
        play.close()
    assert play.lines[-1].strip() == "[reverie] play: stopped" and "Traceback" not in play.output()


def test_play_on_a_dmc_pixel_run_exits_without_an_egl_traceback(tmp_path_factory):
    """Issue 27: dm_control's EGL context is made current on the play session's own thread; left to dm_control's
    exit handler it was freed from the main thread and the process printed an ``EGL_BAD_ACCESS`` traceback after
    ``[reverie] play: stopped``. The server now closes the env on the session's thread when it stops."""
    import json
    import signal
    import urllib.request

    pytest.importorskip("dm_control", reason="needs dm_control and mujoco<4: pip install -e '.[dmc]'")
    from helpers.play_process import PlayProcess

    from reverie.cli import main
    from reverie.envs import dmc

    try:
        dmc.select_gl(required=True)
    except dmc.GLUnavailableError as err:
        pytest.skip(f"no headless OpenGL for DMC pixels here: {err}")
    run_dir = tmp_path_factory.getbasetemp() / "play_dmc_run"
    if not run_dir.exists():
        assert main(["train", "exp=debug", "env=dmc_vision", "env.num_envs=1", "env.time_limit=8", f"run_dir={run_dir}",
                     "train.steps=16", "train.prefill=8", "train.eval_episodes=1", "train.eval_every=0"]) == 0
    play = PlayProcess(run_dir)
    try:
        address = play.address(180)
        assert address is not None, play.output()
        step = urllib.request.Request(address + "api/step", data=json.dumps({"policy": True}).encode(),
                                      headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(step, timeout=60) as answer:  # renders: the GL context exists now
            assert answer.status == 200 and json.load(answer)["real"]["step"] == 1
        play.process.send_signal(signal.SIGINT)
        assert play.process.wait(60) == 0, play.output()
    finally:
        play.close()
    assert play.lines[-1].strip() == "[reverie] play: stopped", play.output()
    assert "Traceback" not in play.output() and "EGL" not in play.output(), play.output()
