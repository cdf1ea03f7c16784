"""Opening an image file and refusing what its header alone shows is wrong, before any voxel is read.

A header says how many bytes its voxels take (the grid times the data type's size); nibabel
allocates that much before it reads a byte of them. A header can say anything: a ``.nii.gz`` of
144 bytes may declare a 3 GiB volume. So the declared size is held against what the file can
yield first:

- an uncompressed file holds exactly its size;
- a gzip file can yield at most its size times ``GZIP_MAX_RATIO`` (deflate's largest ratio is
  about 1032:1: a 258-byte match coded in under two bits); where the declared size is larger
  than ``STREAM_CHECK_BYTES`` (and within that bound) the file is decompressed once, in 1 MiB
  chunks held one at a time, to count the bytes it really yields;
- other compressions (bzip2, zstd) have no useful bound: the streamed count, past the same size.

Then the grid must fit in the RAM available now. Each refusal is one ``DataError`` line naming
the file and both sizes. ``autotune.data.validate`` (the per-case checks) and
``autotune.data.bundle_fit`` (a bundle against what it is given) open every file through
``open_image``.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from autotune.errors import DataError

__all__ = ["GZIP_MAX_RATIO", "STREAM_CHECK_BYTES", "open_image", "declared_bytes", "yieldable_bytes",
           "image_shape", "reason"]

GZIP_MAX_RATIO = 1032  # deflate's largest expansion: a 258-byte match in about 2 bits
STREAM_CHECK_BYTES = 64 * 2**20  # above this, a compressed file's bytes are counted before they are read
_CHUNK = 1 << 20
_MAX_REASON = 200
_SINGLE_FILE_HEADER = 352  # a .nii file's voxels start after its 348-byte header and 4 bytes of extension flag


def open_image(path: str) -> Any:
    """The image at ``path`` opened with nibabel (header only), its header checked (``check_header``).

    Raises:
        DataError: the file is missing or unreadable, or its header is refused; the message names it.
    """
    import nibabel as nib

    if not os.path.isfile(path):
        raise DataError(f"{path}: file not found; fix the path in the datalist or remove the case")
    try:
        image = nib.load(path)
    except Exception as exc:  # nibabel raises many types for a bad file; all mean "cannot read"
        raise DataError(f"cannot read {path}: {reason(exc, path)}; re-export or remove it from the datalist") from exc
    check_header(image, path)
    return image


def check_header(image: Any, path: str) -> None:
    """Refuse what the header alone shows is wrong: a zero, negative or non-finite voxel size (which would
    otherwise surface as a misalignment), a declared size the file cannot hold, and a grid larger than the RAM
    available (which would otherwise end in a MemoryError)."""
    _check_spacing(image, path)
    shape = tuple(int(n) for n in image.shape)
    needed = declared_bytes(image)
    grid = "x".join(map(str, shape))
    holds = yieldable_bytes(image, path, needed)
    if holds is not None and needed > holds[0]:
        raise DataError(f"{path}: the header declares a {grid} grid of {_dtype_name(image)}, {_size(needed)} with "
                        f"its header, but the file {holds[1]} {_size(holds[0])}; the file is truncated or its header "
                        "is corrupt (a wrong dim or datatype field?); re-export it")
    available = _available_ram()
    if available and needed > available:
        raise DataError(f"{path}: the header declares a {grid} grid, {needed / 2**30:.1f} GiB to read, more than "
                        f"the {available / 2**30:.1f} GiB of RAM available; check the header (a corrupt dim field?) "
                        "or crop the image")


def declared_bytes(image: Any) -> int:
    """The bytes the header says the file holds: the voxels' offset plus the grid times the data type's size."""
    shape = tuple(int(n) for n in image.shape)
    try:
        itemsize = int(np.dtype(image.get_data_dtype()).itemsize)
    except Exception:  # noqa: BLE001 - a data type numpy does not know: nibabel refuses it when reading
        itemsize = 1
    voxels = 1
    for n in shape:
        voxels *= max(n, 1)
    offset = int(getattr(image.dataobj, "offset", 0) or 0)
    if offset == 0 and _image_file(image) == _header_file(image):
        offset = _SINGLE_FILE_HEADER
    return offset + voxels * itemsize


def yieldable_bytes(image: Any, path: str, needed: int) -> tuple[int, str] | None:
    """The most bytes the file holding the voxels can yield, and how that is known ("holds", "can yield at
    most"); None where the file cannot be measured (nibabel names the problem when it reads)."""
    data_file = _image_file(image) or path
    try:
        size = os.path.getsize(data_file)
    except OSError:
        return None
    suffix = data_file.lower().rsplit(".", 1)[-1]
    if suffix not in ("gz", "bz2", "zst"):
        return size, "holds"
    if suffix == "gz" and needed > size * GZIP_MAX_RATIO:
        return size * GZIP_MAX_RATIO, f"({_size(size)} compressed) can yield at most"
    if needed <= STREAM_CHECK_BYTES:
        return None  # a small allocation: nibabel's own read finds a short file
    counted = _stream_count(data_file, suffix, needed)
    return None if counted is None else (counted, f"({_size(size)} compressed) yields")


def _stream_count(path: str, suffix: str, cap: int) -> int | None:
    """The bytes a compressed file decompresses to, counted up to ``cap`` in chunks (none held past its
    count); None where it cannot be decompressed (nibabel's read names why)."""
    try:
        if suffix == "gz":
            import gzip

            handle: Any = gzip.open(path, "rb")
        elif suffix == "bz2":
            import bz2

            handle = bz2.open(path, "rb")
        else:
            import zstandard  # type: ignore[import-not-found]  # nibabel's own optional dependency for .zst

            handle = zstandard.ZstdDecompressor().stream_reader(open(path, "rb"), closefd=True)
    except Exception:  # noqa: BLE001 - no such decompressor here: nibabel cannot read it either
        return None
    total = 0
    try:
        with handle:
            while total < cap:
                chunk = handle.read(min(_CHUNK, cap - total))
                if not chunk:
                    break
                total += len(chunk)
    except Exception:  # noqa: BLE001 - a corrupt stream: what came before it is all it yields
        pass
    return total


def image_shape(image: Any, path: str) -> tuple[tuple[int, int, int], int]:
    """The spatial shape and channels of a 3D image, or a 4D one whose last axis holds the channels.

    Raises:
        DataError: any other number of axes.
    """
    shape = tuple(int(n) for n in image.shape)
    if len(shape) == 3:
        return (shape[0], shape[1], shape[2]), 1
    if len(shape) == 4:
        return (shape[0], shape[1], shape[2]), shape[3]
    raise DataError(f"{path}: image has shape {shape}; autotune needs a 3D volume (or 4D with the channels last)")


def reason(exc: BaseException, path: str) -> str:
    """``exc``'s message in one short line, the path shortened to its name (nibabel repeats it in full)."""
    text = " ".join(str(exc).replace(path, os.path.basename(path)).split()) or type(exc).__name__
    return text if len(text) <= _MAX_REASON else text[: _MAX_REASON - 3] + "..."


def _check_spacing(image: Any, path: str) -> None:
    try:  # the raw pixdim (nibabel's get_zooms turns a 0 into 1) and the voxel size the affine implies
        raw = [float(z) for z in np.asarray(image.header["pixdim"])[1:4]]
    except Exception:  # noqa: BLE001 - a header without pixdim: only the affine
        raw = []
    from_affine = [float(z) for z in np.linalg.norm(np.asarray(image.affine, dtype=float)[:3, :3], axis=0)]
    bad = [z for z in raw + from_affine if not np.isfinite(z) or z <= 0]
    zooms = raw if any(not np.isfinite(z) or z <= 0 for z in raw) else from_affine
    if bad:
        raise DataError(f"{path}: the header's voxel spacing is {'x'.join(f'{z:g}' for z in zooms)} mm (a spacing "
                        "must be positive); fix pixdim in the header or re-export the image")


def _image_file(image: Any) -> str | None:
    holder = getattr(image, "file_map", {}).get("image")
    return getattr(holder, "filename", None)


def _header_file(image: Any) -> str | None:
    holder = getattr(image, "file_map", {}).get("header")
    return getattr(holder, "filename", None)


def _dtype_name(image: Any) -> str:
    try:
        return str(np.dtype(image.get_data_dtype()))
    except Exception:  # noqa: BLE001
        return "an unknown data type"


def _size(nbytes: float) -> str:
    """Bytes in words, exact below 1 KiB: ``144 bytes``, ``3.0 GiB (3221225824 bytes)``."""
    if nbytes < 1024:
        return f"{int(nbytes)} bytes"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit} ({int(nbytes)} bytes)"
    return f"{int(nbytes)} bytes"  # pragma: no cover


def _available_ram() -> float | None:
    """Bytes of RAM available now (MemAvailable), or None where it cannot be read."""
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return float(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None
