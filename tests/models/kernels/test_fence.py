"""The kernels fenced off from the rest (issue 26): building an agent leaves the global random streams alone, a
kernel's cached weights follow every write to the weights, and the agent's ``kernels`` setting reaches every module
it builds."""

from __future__ import annotations

import pytest
import torch

from reverie.agents.dreamer import DreamerV3
from reverie.types import ActionSpec

from helpers.agents import dreamer


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
            assert (agent.wm.dynamics.kernels is not None) is (kernels == "auto")  # the probe ran with auto
        streams[kernels] = [torch.random.get_rng_state(), *(torch.cuda.get_rng_state_all()
                                                            if torch.cuda.is_available() else [])]
    assert seeded == []
    assert all(torch.equal(a, b) for a, b in zip(streams["auto"], streams["off"], strict=True))
