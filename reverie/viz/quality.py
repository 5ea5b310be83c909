"""Prediction quality of a world model per open-loop step: PSNR and SSIM of the decoded frames, reward error.

For each image key and open-loop step ``k = 1..T-C`` (row ``t = C - 1 + k``), averaged over sequences:
``quality/<key>_psnr_k<k>`` (``10 log10(255^2 / MSE)`` dB per frame, capped at :data:`PSNR_CAP`),
``quality/<key>_ssim_k<k>`` (SSIM, Wang et al. 2004: scikit-image, 7x7 window, ``data_range`` 255, channels
averaged), their means over ``k`` (``_psnr``, ``_ssim``), ``_recon`` (0-step) and ``_onestep`` variants over all
rows; and ``quality/reward_error_k<k>`` / ``quality/reward_error`` (mean absolute reward error, every model).
"""

from __future__ import annotations

import numpy as np

from reverie.viz.openloop import OpenLoop

PSNR_CAP = 100.0  # dB for an exactly predicted frame (MSE 0)


def psnr(truth: np.ndarray, pred: np.ndarray) -> np.ndarray:
    """PSNR in dB of uint8-range frames ``(..., C, H, W)`` -> ``(...)``, capped at :data:`PSNR_CAP`."""
    diff = truth.astype(np.float64) - pred.astype(np.float64)
    mse = np.mean(diff ** 2, axis=(-3, -2, -1))
    with np.errstate(divide="ignore"):
        value = 10.0 * np.log10(255.0 ** 2 / mse)
    return np.minimum(value, PSNR_CAP)


def ssim(truth: np.ndarray, pred: np.ndarray) -> np.ndarray:
    """SSIM of uint8 frames ``(..., C, H, W)`` -> ``(...)`` (scikit-image, channels averaged)."""
    from skimage.metrics import structural_similarity

    lead = truth.shape[:-3]
    a = truth.reshape(-1, *truth.shape[-3:])
    b = pred.reshape(-1, *pred.shape[-3:])
    out = np.array([structural_similarity(x, y, data_range=255.0, channel_axis=0) for x, y in zip(a, b)])
    return out.reshape(lead)


def prediction_quality(result: OpenLoop) -> dict[str, float]:
    """The module docstring's metrics of one open-loop pass (image keys only for PSNR/SSIM)."""
    c = result.context
    T = result.reward["true"].shape[0]
    out: dict[str, float] = {}
    for key in result.image_keys:
        truth = result.truth[key]
        open_psnr, open_ssim = psnr(truth[c:], result.openloop[key][c:]), ssim(truth[c:], result.openloop[key][c:])
        for k in range(1, T - c + 1):  # (T - C, B) rows -> step k = row + 1
            out[f"quality/{key}_psnr_k{k}"] = float(open_psnr[k - 1].mean())
            out[f"quality/{key}_ssim_k{k}"] = float(open_ssim[k - 1].mean())
        out[f"quality/{key}_psnr"], out[f"quality/{key}_ssim"] = float(open_psnr.mean()), float(open_ssim.mean())
        for name in ("recon", "onestep"):
            pred = getattr(result, name)[key]
            out[f"quality/{key}_psnr_{name}"] = float(psnr(truth, pred).mean())
            out[f"quality/{key}_ssim_{name}"] = float(ssim(truth, pred).mean())
    error = np.abs(result.reward["openloop"][c:] - result.reward["true"][c:])  # (T - C, B)
    for k in range(1, T - c + 1):
        out[f"quality/reward_error_k{k}"] = float(error[k - 1].mean())
    out["quality/reward_error"] = float(error.mean())
    return out


def quality_by_step(metrics: dict[str, float], key: str, name: str = "psnr") -> list[float]:
    """``[quality/<key>_<name>_k1, _k2, ...]`` from :func:`prediction_quality`'s metrics, in step order."""
    values, k = [], 1
    while f"quality/{key}_{name}_k{k}" in metrics:
        values.append(metrics[f"quality/{key}_{name}_k{k}"])
        k += 1
    return values


def quality_plot(metrics: dict[str, float], key: str) -> np.ndarray:
    """PSNR and SSIM of ``key`` over the open-loop step ``k`` (0-step and one-step dashed) as uint8 ``(H, W, 3)``."""
    from reverie.viz.figure import figure_to_array, new_figure

    fig, axes = new_figure(1, 2)
    for ax, name, unit in zip(axes[0], ("psnr", "ssim"), ("dB", "")):
        values = quality_by_step(metrics, key, name)
        ax.plot(range(1, len(values) + 1), values, marker=".", lw=1, label="open loop")
        for other, style in (("recon", "--"), ("onestep", ":")):
            if f"quality/{key}_{name}_{other}" in metrics:
                ax.axhline(metrics[f"quality/{key}_{name}_{other}"], ls=style, lw=0.8, color="0.3",
                           label={"recon": "0-step (posterior)", "onestep": "1-step (prior)"}[other])
        ax.set_xlabel("open-loop step k")
        ax.set_title(f"{key} {name.upper()}" + (f" ({unit})" if unit else ""), fontsize=9)
    axes[0][0].legend(fontsize=7)
    return figure_to_array(fig)


def summary_line(metrics: dict[str, float], steps: tuple[int, ...] = (1, 5, 15)) -> str:
    """One line of :func:`prediction_quality`'s metrics: per image key PSNR/SSIM at ``steps``, 0-step and one-step;
    the reward error."""
    parts = []
    keys = sorted({k[len("quality/"):].rsplit("_psnr", 1)[0] for k in metrics if "_psnr_k" in k})
    for key in keys:
        psnrs, ssims = quality_by_step(metrics, key, "psnr"), quality_by_step(metrics, key, "ssim")
        at = [k for k in steps if k <= len(psnrs)]
        parts.append(f"{key}: PSNR " + " / ".join(f"{psnrs[k - 1]:.1f}" for k in at) + f" dB and SSIM "
                     + " / ".join(f"{ssims[k - 1]:.3f}" for k in at) + f" at k = {', '.join(map(str, at))}; "
                     f"0-step {metrics[f'quality/{key}_psnr_recon']:.1f} dB / "
                     f"{metrics[f'quality/{key}_ssim_recon']:.3f}, 1-step "
                     f"{metrics[f'quality/{key}_psnr_onestep']:.1f} dB / {metrics[f'quality/{key}_ssim_onestep']:.3f}")
    parts.append(f"reward error {metrics['quality/reward_error']:.3f}")
    return "; ".join(parts)
