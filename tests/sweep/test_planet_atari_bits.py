"""examples/planet_atari/bits.py: bin centres and the three PSNRs against values worked out by hand."""

import math

import numpy as np


def test_bin_centres_of_3_bits(planet_atari_script):
    bits = planet_atari_script("bits")
    frames = np.array([0, 31, 32, 255], np.uint8)
    # 3 bits: bins of 32 levels; centre of bin j = (j + 1/2) * 32 * 255 / 256
    assert np.allclose(bits.bin_centres(frames, 3), [15.9375, 15.9375, 47.8125, 239.0625])
    assert np.allclose(bits.bin_centres(frames, 8), [0.498046875, 31.376953125, 32.373046875, 254.501953125])


def test_scores_of_a_black_screen_and_a_perfect_3_bit_prediction(planet_atari_script):
    bits = planet_atari_script("bits")
    truth = np.zeros((6, 2, 4, 4, 3), np.uint8)  # (T, B, H, W, C), all black
    pred = np.full_like(truth, 16)  # every pixel 16: the 3-bit bin centre 15.9375 rounded
    pred[:2] = 200  # context rows: not scored
    scores = bits.bit_depth_scores(truth, pred, bits=3, context=2)
    assert math.isclose(scores["psnr_vs_true"], 10 * math.log10(255 ** 2 / 16 ** 2))  # 24.05 dB
    assert math.isclose(scores["psnr_vs_bins"], 10 * math.log10(255 ** 2 / 0.0625 ** 2))  # 72.2 dB
    assert math.isclose(scores["floor"], 10 * math.log10(255 ** 2 / 15.9375 ** 2))  # 24.08 dB
