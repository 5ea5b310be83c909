"""Scripted controllers for `reverie record --policy helpers.controllers.<name>` in the tests."""

import numpy as np


def cartpole_balance(obs):
    """CartPole-v1: push towards the side the pole falls to (angle plus angular velocity); ``(N,)`` indices."""
    vector = np.asarray(obs["vector"])  # (N, 4): x, x_dot, theta, theta_dot
    return (vector[:, 2] + vector[:, 3] > 0).astype(np.int64)
