"""examples/planet_atari/strips.py: the window it shows by default is the one whose true frames move the most after
the context (synthetic frames, the answer by construction)."""

import numpy as np


def test_the_busiest_window_is_the_one_that_moves_after_the_context(planet_atari_script):
    strips = planet_atari_script("strips")
    truth = np.zeros((8, 3, 4, 4, 3), np.uint8)  # (T, B, H, W, C)
    truth[:5:2, 0] = 255  # window 0 flickers in the context only: not counted
    truth[5::2, 2, 0, 0] = 200  # window 2: one pixel blinks after the context
    truth[6, 1, 1, 1] = 50  # window 1: a smaller blink
    assert strips.busiest_window(truth, context=5) == 2
    assert strips.busiest_window(truth, context=0) == 0  # counting from the start, window 0's flicker wins
