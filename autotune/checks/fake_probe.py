"""The value of ``AUTOTUNE_FAKE_PROBE`` (the fake-probe test hook): ``sleep=S,base=B,patch=P,window=W``.

``parse_fake_probe`` checks the text into a ``FakeModel``, plain data; the prober that answers from it
(``autotune.search.curves.fake.FakeProber``) sits in the search, which imports this, not the other way round.
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune.checks.units import byte_size
from autotune.errors import SpecError

__all__ = ["FAKE_PROBE_ENV", "FakeModel", "parse_fake_probe"]

FAKE_PROBE_ENV = "AUTOTUNE_FAKE_PROBE"
_FIELDS = ("sleep", "base", "patch", "window")


@dataclass(frozen=True)
class FakeModel:
    """The synthetic probe: seconds slept, and the peak's base and slopes in bytes."""

    sleep: float
    base: int
    patch: int
    window: int


def parse_fake_probe(raw: str, where: str = FAKE_PROBE_ENV) -> FakeModel:
    """``sleep=S,base=B,patch=P,window=W`` as a ``FakeModel``.

    Raises:
        SpecError: a field missing, unknown, or not a number >= 0 (sizes: bytes with an optional unit).
    """
    rule = "give sleep=SECONDS,base=BYTES,patch=BYTES,window=BYTES, e.g. sleep=0.5,base=64MiB,patch=32MiB,window=16MiB"
    fields: dict[str, str] = {}
    for part in raw.split(","):
        name, sep, value = part.partition("=")
        if not sep or name.strip() not in _FIELDS or name.strip() in fields:
            raise SpecError(f"{where}: {raw!r}: {part.strip()!r} is not one of {', '.join(_FIELDS)}; {rule}")
        fields[name.strip()] = value.strip()
    if set(fields) != set(_FIELDS):
        raise SpecError(f"{where}: {raw!r}: missing {', '.join(sorted(set(_FIELDS) - set(fields)))}; {rule}")
    try:
        sleep = float(fields["sleep"])
        sizes = {k: byte_size(fields[k], k) for k in ("base", "patch", "window")}
    except (ValueError, SpecError) as exc:
        raise SpecError(f"{where}: {raw!r}: {exc}; {rule}") from exc
    if not 0.0 <= sleep < 3600.0:
        raise SpecError(f"{where}: {raw!r}: sleep must be 0 to 3600 seconds; {rule}")
    return FakeModel(sleep, sizes["base"], sizes["patch"], sizes["window"])
