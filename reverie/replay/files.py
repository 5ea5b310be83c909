"""The replay's snapshot files: the first ``rows`` rows of an ``(L, N, ...)`` array as one ``.npy`` file, memmaps
copied file to file, never through Python memory."""

from __future__ import annotations

import os

import numpy as np

CHUNK = 64 << 20  # bytes per copy_file_range call / per read in the fallback copy


def fsync_path(path: str | os.PathLike) -> None:
    """Flush a file's or a directory's entries to disk (``os.fsync`` on a read-only descriptor)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def bytes_per_row(array: np.ndarray) -> int:
    """Bytes of one row ``array[i]`` of a C-contiguous array."""
    return int(np.prod(array.shape[1:], dtype=np.int64)) * array.dtype.itemsize


def write_rows(array: np.ndarray, path: str, rows: int) -> None:
    """Write ``array[:rows]`` of a C-contiguous ``(L, ...)`` array as the ``.npy`` file ``path`` (via ``path.part``):
    a memmap by :func:`copy_range`, another array by ``np.save`` from a view."""
    tmp = f"{path}.part"
    if isinstance(array, np.memmap) and rows > 0:
        header = {"descr": np.lib.format.dtype_to_descr(array.dtype), "fortran_order": False,
                  "shape": (int(rows), *array.shape[1:])}
        with open(tmp, "wb") as f:
            np.lib.format.write_array_header_2_0(f, header)
            offset = f.tell()
        array.flush()
        copy_range(array.filename, int(array.offset), tmp, offset, rows * bytes_per_row(array))
    else:
        with open(tmp, "wb") as f:
            np.save(f, np.asarray(array[:rows]))
    os.replace(tmp, path)


def npy_rows(path: str) -> tuple[int, int]:
    """``(rows, data offset in bytes)`` of a C-ordered ``.npy`` file; ValueError for another format."""
    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        read = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}.get(version)
        if read is None:
            raise ValueError(f"{path!r} has .npy format version {version}; replay files are 1.0 or 2.0")
        shape, fortran, _ = read(f)
        if fortran:
            raise ValueError(f"{path!r} is Fortran-ordered; replay files are C-ordered")
        return (int(shape[0]) if shape else 0), f.tell()


def copy_range(src: str, src_offset: int, dst: str, dst_offset: int, nbytes: int) -> None:
    """Copy ``nbytes`` from ``src`` at ``src_offset`` into existing ``dst`` at ``dst_offset``
    (``os.copy_file_range``, else chunked reads); ValueError when ``src`` ends early."""
    with open(src, "rb") as fsrc, open(dst, "r+b") as fdst:
        done = 0
        try:
            while done < nbytes:
                n = os.copy_file_range(fsrc.fileno(), fdst.fileno(), min(CHUNK, nbytes - done),
                                       src_offset + done, dst_offset + done)
                if n == 0:
                    raise ValueError(f"{src!r} ended {nbytes - done} bytes early (a partial file)")
                done += n
        except (OSError, AttributeError):  # no copy_file_range here (other kernels, file systems, platforms)
            fsrc.seek(src_offset + done)
            fdst.seek(dst_offset + done)
            while done < nbytes:
                chunk = fsrc.read(min(CHUNK, nbytes - done))
                if not chunk:
                    raise ValueError(f"{src!r} ended {nbytes - done} bytes early (a partial file)") from None
                fdst.write(chunk)
                done += len(chunk)
