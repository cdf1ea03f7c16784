"""A header decides nothing alone: an image file whose header declares more voxels than the file can yield is
refused, in one line naming the file and both sizes, before anything of the declared size is allocated
(``autotune.data.headers``). The property test writes random NIfTI headers over tiny payloads (plain and
gzipped) and holds this process's peak RSS during their checks under a bound far below what the headers
declare."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from autotune.data.headers import GZIP_MAX_RATIO, STREAM_CHECK_BYTES, open_image
from autotune.data.validate import check_case
from autotune.errors import DataError
from autotune.probe.memory import peak_rss_bytes, reset_peak_rss

DTYPES = {2: 1, 4: 2, 8: 4, 16: 4, 64: 8, 256: 1, 512: 2, 768: 4, 1024: 8}  # NIfTI datatype code -> bytes
PEAK_BOUND = 64 * 2**20  # what every check together may add to the peak RSS; the headers declare up to TiBs


def nifti_bytes(dims: list[int], datatype: int, vox_offset: float, payload: bytes, pixdim: float = 1.0) -> bytes:
    """A NIfTI-1 single file: a 348-byte header with these fields, 4 bytes of extension flag, ``payload``."""
    header = bytearray(348)
    struct.pack_into("<i", header, 0, 348)
    struct.pack_into("<8h", header, 40, len(dims), *dims, *[1] * (7 - len(dims)))  # dim[0]: how many follow
    bitpix = 8 * DTYPES.get(datatype, 1)
    struct.pack_into("<2h", header, 70, datatype, bitpix)
    struct.pack_into("<8f", header, 76, 1.0, pixdim, pixdim, pixdim, 1.0, 1.0, 1.0, 1.0)
    struct.pack_into("<f", header, 108, vox_offset)
    struct.pack_into("<f", header, 112, 1.0)  # scl_slope
    struct.pack_into("<2h", header, 252, 0, 0)  # qform, sform: none (the affine comes from pixdim)
    header[344:348] = b"n+1\x00"
    return bytes(header) + b"\x00" * 4 + payload


def _write(path: Path, raw: bytes, zipped: bool) -> Path:
    path.write_bytes(gzip.compress(raw) if zipped else raw)
    return path


headers = st.fixed_dictionaries({
    "dims": st.lists(st.one_of(st.integers(1, 8), st.integers(1, 32767), st.integers(-3, 0)), min_size=1,
                     max_size=7),
    "datatype": st.sampled_from(sorted(DTYPES)),
    "vox_offset": st.sampled_from([352.0, 0.0, 348.0, 1e6, -5.0]),
    "payload": st.one_of(st.binary(max_size=64), st.integers(0, 256).map(lambda n: bytes(range(256))[:n] * 2)),
    "zipped": st.booleans(),
})


@pytest.fixture(scope="module")
def resettable_rss() -> None:
    """Each check's peak is measured from a reset peak RSS (Linux ``clear_refs``)."""
    if not reset_peak_rss():
        pytest.skip("this kernel cannot reset the peak RSS (/proc/self/clear_refs)")


@settings(max_examples=120, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(header=headers)
@example(header={"dims": [1024, 1024, 768], "datatype": 16, "vox_offset": 352.0, "payload": b"\x01" * 64,
                 "zipped": True})  # the 3 GiB volume of a 144-byte file
@example(header={"dims": [700, 700, 700], "datatype": 64, "vox_offset": 352.0, "payload": b"", "zipped": False})
def test_random_headers_over_tiny_payloads_allocate_nothing_they_declare(
        header: dict, tmp_path_factory: pytest.TempPathFactory, resettable_rss: None) -> None:
    folder = tmp_path_factory.mktemp("header", numbered=True)
    raw = nifti_bytes(header["dims"], header["datatype"], header["vox_offset"], header["payload"])
    suffix = ".nii.gz" if header["zipped"] else ".nii"
    image = _write(folder / f"image{suffix}", raw, header["zipped"])
    label = _write(folder / f"label{suffix}", raw, header["zipped"])
    reset_peak_rss()
    base = peak_rss_bytes()
    try:
        check_case({"image": str(image), "label": str(label)})
    except DataError as exc:  # the one refusal allowed; anything else is a bug
        assert "\n" not in str(exc) and (str(image) in str(exc) or str(label) in str(exc)), exc
    grown = peak_rss_bytes() - base
    assert grown < PEAK_BOUND, f"{header}: peak RSS grew by {grown / 2**20:.1f} MiB"


def test_a_header_larger_than_its_file_is_refused_naming_both_sizes(tmp_path: Path) -> None:
    raw = nifti_bytes([1024, 1024, 768], 16, 352.0, b"\x01" * 64)  # 3 GiB of float32 declared
    small = _write(tmp_path / "small.nii.gz", raw, True)
    with pytest.raises(DataError) as refused:
        open_image(str(small))
    size = small.stat().st_size
    assert str(refused.value) == (
        f"{small}: the header declares a 1024x1024x768 grid of float32, 3.0 GiB (3221225824 bytes) with its header, "
        f"but the file ({size} bytes compressed) can yield at most {size * GZIP_MAX_RATIO / 1024:.1f} KiB "
        f"({size * GZIP_MAX_RATIO} bytes); the file is truncated or its header is corrupt (a wrong dim or datatype "
        "field?); re-export it")
    plain = _write(tmp_path / "plain.nii", raw, False)
    with pytest.raises(DataError, match=rf"plain.nii: .* but the file holds {len(raw)} bytes; "):
        open_image(str(plain))


def test_a_compressed_file_within_the_ratio_bound_is_counted_before_it_is_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Zeros compress about 1000:1: a file can pass the ratio bound yet hold less than its header declares. Past
    ``STREAM_CHECK_BYTES`` (64 MiB; 1 MiB here, so the files stay small) its bytes are counted, streamed a chunk
    at a time, before nibabel allocates."""
    import autotune.data.headers as headers_module

    assert STREAM_CHECK_BYTES == 64 * 2**20
    monkeypatch.setattr(headers_module, "STREAM_CHECK_BYTES", 2**20)
    side = 160  # 160^3 uint8 = 3.9 MiB declared; 3 MiB of zeros and 4 KiB of noise given
    given = bytes(3 * 2**20) + np.random.default_rng(0).bytes(2**12)
    path = _write(tmp_path / "short.nii.gz", nifti_bytes([side, side, side], 2, 352.0, given), True)
    assert path.stat().st_size * GZIP_MAX_RATIO > side**3, "within the ratio bound: only the count can refuse it"
    with pytest.raises(DataError, match=rf"short.nii.gz: the header declares a 160x160x160 grid of uint8, .* yields "
                                        rf"3.0 MiB \({352 + len(given)} bytes\)"):
        open_image(str(path))
    whole = _write(tmp_path / "whole.nii.gz", nifti_bytes([side, side, side], 2, 352.0, bytes(side**3)), True)
    assert tuple(open_image(str(whole)).shape) == (side, side, side)  # the count passes a file that holds it all


def test_a_real_image_passes(tmp_path: Path) -> None:
    import nibabel as nib

    path = tmp_path / "real.nii.gz"
    nib.save(nib.Nifti1Image(np.arange(4096, dtype=np.float32).reshape(16, 16, 16), np.eye(4)), str(path))
    assert tuple(open_image(str(path)).shape) == (16, 16, 16)
