"""reverie.runtime.cpu_memory: freed tensor memory is reused instead of page-faulting on every big tensor."""

import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import random, resource, sys
    import torch
    if sys.argv[1] == "keep":
        from reverie.runtime.cpu_memory import keep_freed_memory
        assert keep_freed_memory() is True
        assert keep_freed_memory() is True  # once per process; a second call is a no-op
    else:  # glibc's starting state, pinned: every block of 128 KiB or more is a fresh mmap, given back on free
        import ctypes
        from reverie.runtime.cpu_memory import M_MMAP_THRESHOLD
        assert ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, 128 * 1024) == 1
    def faults():
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    rng = random.Random(0)
    counted = touched = 0
    for round in range(70):  # as an update does: tensors of a few MiB, allocated, written and freed in any order
        start = faults()
        sizes = [rng.randint(1, 11) << 18 for _ in range(10)]  # float32 elements: 1-11 MiB each
        tensors = [torch.ones(n) for n in sizes]
        rng.shuffle(tensors)
        while tensors:
            tensors.pop()
        if round >= 10:  # after glibc's adaptive thresholds have settled
            counted += faults() - start
            touched += sum(sizes) * 4 // 4096  # pages written
    print(counted, touched)
""")


def minor_faults(mode: str) -> tuple[int, int]:
    """``(minor page faults, pages written)`` over the 60 counted rounds of SCRIPT."""
    done = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, check=True)
    faults, touched = done.stdout.strip().splitlines()[-1].split()
    return int(faults), int(touched)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt: Linux only")
def test_keep_freed_memory_stops_page_faults_on_reallocated_tensors():
    (mapped, touched), (kept, _) = minor_faults("mmap"), minor_faults("keep")
    # With the settings the freed memory stays in the heap and is reused: ~3,000 faults in all (start-up of the
    # rounds, not per round) for ~0.91 M pages written. The contrast pins glibc's starting threshold (128 KiB;
    # mallopt turns its adaptive raising off, which otherwise makes an unpinned run trim anywhere from ~1% to ~25%
    # of the pages), so every tensor arrives as fresh pages: about one fault per page written.
    assert kept < touched // 100
    assert mapped > touched // 2


RSS_MIB = textwrap.dedent("""
    def rss_mib():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096 / 2**20
""")  # the scripts' resident memory in MiB

RELEASE = RSS_MIB + textwrap.dedent("""
    import sys
    import torch
    from reverie.runtime.cpu_memory import keep_freed_memory, release_freed_memory
    assert keep_freed_memory() is True
    tensors = [torch.ones(1 << 18) for _ in range(256)]  # 256 x 1 MiB, below the 12 MiB mmap threshold: heap
    held = rss_mib()
    del tensors  # freed, but kept by the process (trim threshold 1 GiB)
    freed = rss_mib()
    if sys.argv[1] == "release":
        assert release_freed_memory() is True
    print(held, freed, rss_mib())
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc_trim: Linux only")
@pytest.mark.parametrize("mode", ["release", "keep"])
def test_release_freed_memory_hands_the_kept_heap_back(mode):
    """The 256 MiB a run's tensors left in the heap stay resident under keep_freed_memory; release_freed_memory
    gives them back (the contrast: without the call they stay)."""
    done = subprocess.run([sys.executable, "-c", RELEASE, mode], capture_output=True, text=True, check=True)
    held, freed, after = map(float, done.stdout.strip().splitlines()[-1].split())
    assert freed > held - 16  # kept: the free alone returns (almost) nothing
    if mode == "release":
        assert after < held - 200  # at least 200 of the 256 MiB handed back
    else:
        assert after > held - 16


BIG = RSS_MIB + textwrap.dedent("""
    import ctypes, sys
    import torch
    from reverie.runtime.cpu_memory import M_MMAP_THRESHOLD, keep_freed_memory
    assert keep_freed_memory() is True
    if sys.argv[1] == "32":  # the contrast: the threshold this module set before (glibc's largest)
        assert ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1
    before = rss_mib()
    outputs = torch.ones(16 * 1024, 255)  # the float32 two-hot outputs of 16 x 1,024 imagined rows: 15.9 MiB
    held = rss_mib()
    del outputs
    print(before, held, rss_mib())
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt: Linux only")
@pytest.mark.parametrize("threshold", ["kept", "32"])
def test_the_16_mib_tensors_of_an_update_go_back_to_the_system_when_freed(threshold):
    """A block of 12 MiB or more that no free heap block fits is mapped afresh and unmapped on free, so the imagined
    rows' 16 MiB outputs do not stay in the heap between updates; with the threshold at 32 MiB (the contrast) the
    block is carved from the heap and, freed, stays resident (the trim threshold is 1 GiB)."""
    done = subprocess.run([sys.executable, "-c", BIG, threshold], capture_output=True, text=True, check=True)
    before, held, after = map(float, done.stdout.strip().splitlines()[-1].split())
    assert held > before + 15  # the 15.9 MiB were written
    if threshold == "kept":
        assert after < held - 14  # unmapped: (nearly) all of it handed back
    else:
        assert after > held - 1
