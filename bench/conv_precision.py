"""Forward + backward of the conv stacks' layers at float32 and under bf16 autocast, channels-last, on this CPU:
the measurement behind ``reverie.models.conv.conv_compute``'s rule (float32 on a CPU, except the current agent's
stride-1 5x5 layers where the CPU has AMX).

    OMP_NUM_THREADS=1 .venv/bin/python bench/conv_precision.py             # 512 images per layer, median of 3
    OMP_NUM_THREADS=1 .venv/bin/python bench/conv_precision.py --images 1024

Layers: the 2025 encoder's at size xs (``cnn_depth`` 16, ``mults`` 2 3 4 4: 5x5, stride 1, SAME; the max pool
after each is not timed) and the 2023 encoder's and decoder's four each (4x4, stride 2, padding 1, depth 16). Prints ms per
layer at each precision and their ratio; the whole update's change: ``bench/paired_update.py --preset``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

LAYERS = {  # name: (module class, cin, cout, side of the input, kernel, stride, padding)
    "2025 conv 3->32 @64": (nn.Conv2d, 3, 32, 64, 5, 1, 2),
    "2025 conv 32->48 @32": (nn.Conv2d, 32, 48, 32, 5, 1, 2),
    "2025 conv 48->64 @16": (nn.Conv2d, 48, 64, 16, 5, 1, 2),
    "2025 conv 64->64 @8": (nn.Conv2d, 64, 64, 8, 5, 1, 2),
    "2023 conv 3->16 @64": (nn.Conv2d, 3, 16, 64, 4, 2, 1),
    "2023 conv 16->32 @32": (nn.Conv2d, 16, 32, 32, 4, 2, 1),
    "2023 conv 32->64 @16": (nn.Conv2d, 32, 64, 16, 4, 2, 1),
    "2023 conv 64->128 @8": (nn.Conv2d, 64, 128, 8, 4, 2, 1),
    "2023 deconv 128->64 @4": (nn.ConvTranspose2d, 128, 64, 4, 4, 2, 1),
    "2023 deconv 64->32 @8": (nn.ConvTranspose2d, 64, 32, 8, 4, 2, 1),
    "2023 deconv 32->16 @16": (nn.ConvTranspose2d, 32, 16, 16, 4, 2, 1),
    "2023 deconv 16->3 @32": (nn.ConvTranspose2d, 16, 3, 32, 4, 2, 1),
}


def time_layer(spec: tuple, images: int, bf16: bool, rounds: int = 3) -> float:
    """Median seconds of one forward + backward of the layer on ``images`` random channels-last inputs (the input's
    gradient too, except for an encoder's first layer: an update does not differentiate the images)."""
    cls, cin, cout, side, kernel, stride, padding = spec
    layer = cls(cin, cout, kernel, stride, padding)
    x = torch.randn(images, cin, side, side).contiguous(memory_format=torch.channels_last)
    x.requires_grad_(not (cls is nn.Conv2d and cin == 3))

    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            y = layer(x)
        y.float().sum().backward()

    step()  # warm-up (oneDNN picks its kernels)
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=512)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), {args.images} images, channels-last")
    print(f"{'layer':<24} {'float32 ms':>11} {'bf16 ms':>9} {'float32/bf16':>13}")
    for name, spec in LAYERS.items():
        f32, bf16 = time_layer(spec, args.images, False), time_layer(spec, args.images, True)
        print(f"{name:<24} {f32 * 1e3:>11.0f} {bf16 * 1e3:>9.0f} {f32 / bf16:>13.2f}")


if __name__ == "__main__":
    main()
