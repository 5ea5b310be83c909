"""PSNR / SSIM per open-loop step (reverie.viz.quality), against values computed by hand."""

import math

import numpy as np
import pytest

from reverie.viz.openloop import OpenLoop
from reverie.viz.quality import PSNR_CAP, prediction_quality, psnr, quality_by_step, ssim, summary_line


def test_psnr_of_a_known_mean_squared_error():
    truth = np.zeros((1, 3, 8, 8), np.uint8)
    assert psnr(truth, np.full_like(truth, 16))[0] == pytest.approx(20 * math.log10(255 / 16))  # MSE 256
    half = truth.copy()
    half[..., :4] = 255  # half the pixels off by 255: MSE 255^2 / 2
    assert psnr(truth, half)[0] == pytest.approx(10 * math.log10(2))
    assert psnr(truth, truth)[0] == PSNR_CAP


def test_ssim_of_identical_and_of_constant_frames():
    rng = np.random.default_rng(0)
    frame = rng.integers(0, 256, (3, 16, 16), dtype=np.uint8)
    assert ssim(frame[None], frame[None])[0] == pytest.approx(1.0)
    # constant frames a and b: zero variances, so SSIM is the luminance term (2ab + C1) / (a^2 + b^2 + C1),
    # C1 = (0.01 * 255)^2
    a, b, c1 = 100.0, 110.0, (0.01 * 255) ** 2
    value = ssim(np.full((1, 3, 16, 16), a, np.uint8), np.full((1, 3, 16, 16), b, np.uint8))[0]
    assert value == pytest.approx((2 * a * b + c1) / (a * a + b * b + c1), rel=1e-9)


def test_prediction_quality_per_open_loop_step():
    T, C = 4, 2
    truth = np.zeros((T, 1, 3, 8, 8), np.uint8)
    openloop = truth.copy()
    openloop[2], openloop[3] = 16, 32  # k = 1 off by 16, k = 2 off by 32
    onestep = np.full_like(truth, 8)
    reward = {"true": np.array([[0.0], [1.0], [1.0], [0.0]], np.float32),
              "openloop": np.array([[0.0], [1.0], [0.5], [2.0]], np.float32),
              "recon": np.zeros((T, 1), np.float32)}
    result = OpenLoop(context=C, truth={"image": truth}, openloop={"image": openloop}, recon={"image": truth.copy()},
                      onestep={"image": onestep}, reward=reward)
    q = prediction_quality(result)
    assert q["quality/image_psnr_k1"] == pytest.approx(20 * math.log10(255 / 16))
    assert q["quality/image_psnr_k2"] == pytest.approx(20 * math.log10(255 / 32))
    assert "quality/image_psnr_k3" not in q
    assert q["quality/image_psnr"] == pytest.approx((20 * math.log10(255 / 16) + 20 * math.log10(255 / 32)) / 2)
    assert q["quality/image_psnr_recon"] == PSNR_CAP and q["quality/image_ssim_recon"] == pytest.approx(1.0)
    assert q["quality/image_psnr_onestep"] == pytest.approx(20 * math.log10(255 / 8))
    assert q["quality/reward_error_k1"] == pytest.approx(0.5) and q["quality/reward_error_k2"] == pytest.approx(2.0)
    assert q["quality/reward_error"] == pytest.approx(1.25)
    assert q["quality/image_ssim_k1"] > q["quality/image_ssim_k2"]  # further off, less similar
    assert quality_by_step(q, "image") == [q["quality/image_psnr_k1"], q["quality/image_psnr_k2"]]
    line = summary_line(q, steps=(1, 2))
    assert "image: PSNR 24.0 / 18.0 dB" in line and "reward error 1.250" in line


def test_a_world_model_without_images_gets_the_reward_error_alone():
    reward = {"true": np.zeros((3, 2), np.float32), "openloop": np.ones((3, 2), np.float32),
              "recon": np.zeros((3, 2), np.float32)}
    result = OpenLoop(context=1, truth={"vector": np.zeros((3, 2, 4), np.float32)}, openloop={}, recon={},
                      onestep={}, reward=reward, decoded=False)
    assert prediction_quality(result) == {"quality/reward_error_k1": 1.0, "quality/reward_error_k2": 1.0,
                                          "quality/reward_error": 1.0}
