"""The kernels fenced off from the rest (issue 26): building an agent leaves the global random streams alone, the
readable modules import nothing from the kernels, and the agent's ``kernels`` setting decides which modules
:func:`reverie.models.kernels.install` swaps for their fast subclasses."""

from __future__ import annotations

import ast
from functools import partial
from pathlib import Path

import pytest
import torch

import reverie
from reverie.agents import DreamerV3_2025
from reverie.agents.dreamer import DreamerV3
from reverie.models.dynamics import BlockRSSM, CategoricalRSSM
from reverie.models.kernels import FusedBlockRSSM, FusedRSSM, OneHotLinear
from reverie.types import ActionSpec

from helpers.agents import dreamer
from helpers.state_compare import assert_same


def test_building_an_agent_leaves_the_global_random_streams_alone(monkeypatch):
    """The fused scan's construction probe draws from the global streams: it must hand the CPU stream (and the CUDA
    streams where there are any) back as they were, and never seed them (``torch.manual_seed`` also seeds every CUDA
    device, lazily: after a fork that restored only the CPU stream, every run would draw the same CUDA stream)."""
    seeded = []
    for target in (torch, torch.random, torch.cuda):
        for name in ("manual_seed", "manual_seed_all", "seed", "seed_all"):
            if hasattr(target, name):
                def spy(*args, name=name, call=getattr(target, name)):
                    seeded.append(name)
                    return call(*args)

                monkeypatch.setattr(target, name, spy)
    streams = {}
    for kernels in ("auto", "off"):  # building draws the initial weights; the probe must add nothing to that
        torch.default_generator.manual_seed(1234)  # the generator's own method: not one of the patched functions
        for device in ["cpu"] + (["cuda"] if torch.cuda.is_available() else []):
            if device == "cuda":
                for generator in torch.cuda.default_generators:
                    generator.manual_seed(1234)
            agent = DreamerV3({"vector": (4,)}, ActionSpec(True, 2), **dreamer(kernels=kernels), device=device)
            assert type(agent.wm.dynamics) is (FusedRSSM if kernels == "auto" else CategoricalRSSM)  # the probe ran
        streams[kernels] = [torch.random.get_rng_state(), *(torch.cuda.get_rng_state_all()
                                                            if torch.cuda.is_available() else [])]
    assert seeded == []
    assert all(torch.equal(a, b) for a, b in zip(streams["auto"], streams["off"], strict=True))


READABLE_ROOT = Path(reverie.__file__).parent
INSTALLERS = {"agents/dreamer.py", "agents/dreamer2025.py", "agents/planet.py"}  # they call install, nothing else


def kernel_imports(path: Path) -> list[tuple[str, tuple[str, ...]]]:
    """``(module, names)`` of every import of ``reverie.models.kernels`` (or below it) in ``path``, wherever it
    stands (module level or inside a function), absolute or relative."""
    package = ".".join(("reverie", *path.relative_to(READABLE_ROOT).parent.parts))
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(a.name, ()) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this file's package
                parent = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, *([base] if base else [])])
            names = tuple(a.name for a in node.names)
            found += [(base, names)] + [(f"{base}.{n}", ()) for n in names]
    return [(m, n) for m, n in found if m == "reverie.models.kernels" or m.startswith("reverie.models.kernels.")]


def test_the_readable_modules_import_nothing_from_the_kernels():
    """The readable path stands alone: no file of reverie outside ``reverie/models/kernels/`` imports the kernels,
    except the three agents, which import the one install step and nothing else."""
    offenders = {}
    for path in sorted(READABLE_ROOT.rglob("*.py")):
        rel = path.relative_to(READABLE_ROOT).as_posix()
        if rel.startswith("models/kernels/"):
            continue
        found = kernel_imports(path)
        if rel in INSTALLERS:
            found = [(m, n) for m, n in found if not (m == "reverie.models.kernels" and set(n) <= {"install"})
                     and m != "reverie.models.kernels.install"]
        if found:
            offenders[rel] = found
    assert offenders == {}
    assert kernel_imports(READABLE_ROOT / "agents" / "dreamer.py")  # the parser sees the agents' install import


def linears(module: torch.nn.Module) -> dict[str, type]:
    """``{name: class}`` of every ``nn.Linear`` (or subclass) in ``module``."""
    return {name: type(m) for name, m in module.named_modules() if isinstance(m, torch.nn.Linear)}


# the layers that read the categorical RSSM's features: its input layer and each head's first layer
FEATURE_READERS = {"wm.dynamics.in_z", "wm.representation.decoder.hidden.0.0", "wm.reward_head.hidden.0.0",
                   "wm.cont_head.hidden.0.0", "actor.net.hidden.0.0", "critic.hidden.0.0", "slow_critic.hidden.0.0"}


def small_dreamer(kernels: str, own: str | None = None) -> DreamerV3:
    """DreamerV3 whose dynamics comes from a partial without ``kernels`` (``own``: with it); units 24 for the RSSM,
    so that no other layer's input width (its GRU's 24 + 16) equals the features' 16 + 4 * 4."""
    torch.manual_seed(0)
    dynamics = {} if own is None else {"kernels": own}
    return DreamerV3({"vector": (4,)}, ActionSpec(True, 2), dynamics=partial(CategoricalRSSM, deter=16, stoch=4,
                                                                              classes=4, units=24, **dynamics),
                     units=16, layers=1, horizon=3, precision="float32", kernels=kernels)


@pytest.mark.parametrize("kernels", ["auto", "off"])
def test_the_agent_setting_reaches_a_dynamics_built_from_a_partial_without_it(kernels):
    """``DreamerV3(dynamics=partial(CategoricalRSSM, deter=...), kernels=...)``: the partial leaves the dynamics'
    own ``kernels`` at its default, yet the agent's setting decides for every module it builds (issue 26: with
    ``off`` the dynamics still had its fast paths). Likewise the 2025 agent's dynamics dict without ``kernels``."""
    on = kernels == "auto"
    agent = small_dreamer(kernels)
    assert type(agent.wm.dynamics) is (FusedRSSM if on else CategoricalRSSM)
    found = linears(agent)
    fast = {name for name, cls in found.items() if cls is OneHotLinear}
    assert fast == (FEATURE_READERS if on else set())
    assert all(cls is torch.nn.Linear for name, cls in found.items() if name not in fast)
    agent_2025 = DreamerV3_2025({"vector": (4,)}, ActionSpec(True, 2), dynamics=dict(deter=16, hidden=8, stoch=3,
                                                                                     classes=4, blocks=4),
                                units=8, horizon=3, precision="float32", kernels=kernels)
    assert type(agent_2025.wm.dynamics) is (FusedBlockRSSM if on else BlockRSSM)
    assert OneHotLinear not in linears(agent_2025).values()  # the 2025 model has no categorical RSSM


def test_a_dynamics_built_off_stays_readable_under_an_agent_with_kernels():
    """A module's own ``kernels="off"`` (e.g. an edited RSSM the fused scan would refuse) is not overridden, nor
    are the layers that read its features."""
    agent = small_dreamer("auto", own="off")
    assert type(agent.wm.dynamics) is CategoricalRSSM
    assert set(linears(agent).values()) == {torch.nn.Linear}
    assert type(small_dreamer("auto").wm.dynamics) is FusedRSSM  # the same agent without the dynamics' own "off"


def test_install_keeps_every_state_dict_key_and_value():
    """The install step swaps classes: the saved state of an agent with kernels is the same, key for key and value
    for value, as that of the same agent without (checkpoints resume either way)."""
    states = {}
    for kernels in ("auto", "off"):
        torch.manual_seed(0)
        agent = DreamerV3({"vector": (4,)}, ActionSpec(True, 2), **dreamer(kernels=kernels))
        assert (type(agent.wm.dynamics) is FusedRSSM) is (kernels == "auto")
        states[kernels] = agent.state_dict()
    assert_same(states["auto"], states["off"])
