"""One intra-op torch thread for a test module's tiny tensors (on a loaded 2-core machine two threads made a tiny
update 60x slower), restored afterwards: ``one_thread = pytest.fixture(autouse=True)(single_thread)``."""

from __future__ import annotations

from collections.abc import Iterator

import torch


def single_thread() -> Iterator[None]:
    """Generator for a pytest fixture: ``torch.set_num_threads(1)`` for the test, the previous count after it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
