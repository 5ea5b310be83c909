"""bench/agents_table.py: the commands of the two-agent comparison and its table, on run folders the test writes."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.agents_table import main, parse_name, plan, report  # noqa: E402
from reverie.configs.compose import load_config  # noqa: E402


def test_plan_gives_each_env_both_agents_under_one_preset_and_budget(tmp_path):
    lines = plan(tmp_path, 25, [0, 1])
    assert len(lines) == 3 * 2 * 2  # envs x seeds x agents
    first, second = lines[0].split(), lines[1].split()
    assert first[:4] == [".venv/bin/python", "-m", "reverie", "train"]
    # the pair differs in the agent and its run folder only: same preset, seed, threads and budget
    assert [a for a in first if not a.startswith(("agent=", "run_dir="))] == \
           [a for a in second if not a.startswith(("agent=", "run_dir="))]
    assert "agent=dreamerv3" in first and "agent=dreamerv3_2025" in second
    assert "train.max_minutes=25" in first and f"run_dir={tmp_path}/cartpole_dreamerv3_2025_s0" in second
    assert "train.steps=1000000" in first  # the budget, not the preset's length, ends every run
    for line in (lines[0], lines[1], lines[-1]):  # every key exists (load_config refuses unknown keys)
        cfg = load_config([a for a in line.split()[4:]])
        assert cfg.train.max_minutes == 25 and cfg.threads == 1
    dmc = load_config(lines[-1].split()[4:])
    assert dmc.agent.name == "dreamerv3_2025" and dmc.env.task == "cartpole_swingup" and dmc.seed == 1
    assert dmc.agent.train_ratio == 128 and dmc.agent.module.lr == pytest.approx(1.2e-4)  # its CPU preset
    with pytest.raises(ValueError, match="must be > 0 minutes"):
        plan(tmp_path, 0, [0])


def test_run_names_parse_back_with_the_longer_agent_first():
    assert parse_name("cartpole_dreamerv3_2025_s3") == ("cartpole", "dreamerv3_2025", 3)
    assert parse_name("dmc_cartpole_swingup_dreamerv3_s0") == ("dmc_cartpole_swingup", "dreamerv3", 0)
    assert parse_name("cartpole_planet_s0") is None and parse_name("notes") is None


def write_run(out: Path, name: str, evals, updates=100, finished=True):
    run = out / name
    run.mkdir(parents=True)
    if finished:
        steps = evals[-1][0]
        run.joinpath("config.yaml").write_text("train:\n  eval_every: 2500\n")
        run.joinpath("summary.json").write_text(json.dumps(
            {"env_steps": steps, "updates": updates, "wall_s": evals[-1][1], "evals": evals,
             "eval_return": evals[-1][2]}))


def test_report_reads_the_budget_return_and_the_return_at_equal_env_steps(tmp_path, capsys):
    # 2023 agent: faster per step, reaches 7,500 and 6,000 env steps in the budget; 2025: 5,200 and 5,100
    write_run(tmp_path, "cartpole_dreamerv3_s0", [[2500, 300, 100.0], [5000, 600, 300.0], [7500, 1500, 500.0]])
    write_run(tmp_path, "cartpole_dreamerv3_s1", [[2500, 400, 50.0], [5000, 900, 200.0], [6000, 1500, 250.0]])
    write_run(tmp_path, "cartpole_dreamerv3_2025_s0", [[2500, 700, 20.0], [5000, 1400, 400.0], [5200, 1500, 410.0]])
    write_run(tmp_path, "cartpole_dreamerv3_2025_s1", [[2500, 700, 30.0], [5000, 1450, 100.0], [5100, 1500, 120.0]])
    write_run(tmp_path, "pendulum_dreamerv3_s0", [[2500, 10, -900.0]], finished=False)
    table = report(tmp_path)
    rows = {line.split(" | ")[1]: line.split(" | ") for line in table.splitlines() if line.startswith("| cartpole")}
    old, new = rows["dreamerv3"], rows["dreamerv3_2025"]
    assert old[3] == "7,500 / 6,000" and old[5] == "25.0 / 25.0"
    assert old[6] == "500.0 / 250.0" and old[7].startswith("375.0 [")  # (500 + 250) / 2 at the budget
    # equal env steps: the fewest any cartpole run reached (5,100) down to the eval grid (2,500): 5,000, where every
    # run has a clocked evaluation (not the final one at 5,100 of the 2025 seed 1)
    assert old[8] == "300.0 / 200.0 (5,000)" and old[9].startswith("250.0 [")
    assert new[8] == "400.0 / 100.0 (5,000)"
    # t interval over 2 seeds: 250 +- t(0.975, 1) * std(ddof=1) / sqrt(2) = 250 +- 12.7062 * 212.13 / 1.4142
    assert new[9] == "250.0 [-1655.9, 2155.9] |"
    assert "Unfinished (no summary.json): pendulum_dreamerv3_s0" in table
    assert main(["report", str(tmp_path)]) == 0 and capsys.readouterr().out == table
    with pytest.raises(SystemExit):
        main(["report", str(tmp_path / "missing")])
    assert "no such folder" in capsys.readouterr().err
