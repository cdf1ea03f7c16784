"""YAML read within limits: size, nodes after alias expansion, nesting; plain data only.

A small YAML file of nested aliases (``&a [*b, *b, ...]``, nine levels of nine) stands for
hundreds of millions of values: any walk over what it loads, or MONAI's ``ConfigParser``,
runs for hours. So every YAML file autotune reads is first scanned as a stream of events
(no tree is built, no recursion): the nodes it stands for are counted with each alias
counted as the nodes of its anchor, and the scan stops at the first limit passed
(``MAX_YAML_NODES``, ``MAX_YAML_DEPTH``; the file's size, ``MAX_FILE_BYTES``, before it is
read). An alias inside its own anchor (a structure holding itself) is refused too. Only then
is the file loaded, by ``yaml.SafeLoader`` with two changes that keep configs plain data:
a date stays the text it is written as, and the tags that build other types (``!!set``,
``!!binary``, ``!!omap``, ``!!pairs``, ``!!timestamp``) are refused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from autotune.checks.values import Error
from autotune.errors import ConfigError

__all__ = ["MAX_FILE_BYTES", "MAX_YAML_NODES", "MAX_YAML_DEPTH", "YamlLimitError", "check_size", "scan_yaml",
           "load_yaml"]

MAX_FILE_BYTES = 64 * 1024**2  # a config, datalist or statistics file; far above any real one
MAX_YAML_NODES = 200_000  # values after alias expansion; a bundle config holds about 200
MAX_YAML_DEPTH = 100  # nesting levels; real configs use under 10

_Loader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_NOT_PLAIN = ("tag:yaml.org,2002:set", "tag:yaml.org,2002:binary", "tag:yaml.org,2002:omap",
              "tag:yaml.org,2002:pairs", "tag:yaml.org,2002:timestamp")


class YamlLimitError(ValueError):
    """A YAML document passes a limit; the message says which."""


class _PlainLoader(_Loader):  # type: ignore[misc, valid-type]
    """SafeLoader without implicit dates, refusing tags that build non-plain types."""


_PlainLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in _Loader.yaml_implicit_resolvers.items()
}


def _not_plain(loader: Any, node: yaml.Node) -> Any:
    raise yaml.constructor.ConstructorError(
        None, None, f"the tag {node.tag.rsplit(':', 1)[-1]!r} does not hold plain data; write a plain value",
        node.start_mark)


for _tag in _NOT_PLAIN:
    _PlainLoader.add_constructor(_tag, _not_plain)


def check_size(path: Path, where: str, error: Error = ConfigError) -> None:
    """Refuse a file larger than ``MAX_FILE_BYTES`` before reading it."""
    try:
        size = path.stat().st_size
    except OSError:
        return  # the read names the problem
    if size > MAX_FILE_BYTES:
        raise error(f"{where}: refused: {size} bytes is more than the limit of {MAX_FILE_BYTES} bytes for a file "
                    "autotune reads; check it is the right file")


def scan_yaml(text: str) -> int:
    """Count the values ``text`` stands for, aliases expanded, from its event stream (no tree, no recursion).

    Raises:
        YamlLimitError: more than ``MAX_YAML_NODES`` values, nesting deeper than ``MAX_YAML_DEPTH``, or an
            alias inside its own anchor.
        yaml.YAMLError: the text is not valid YAML.
    """
    loader = _Loader(text)
    try:
        return _count(loader)
    finally:
        loader.dispose()


def _count(loader: Any) -> int:
    """Walk the events once: each open collection on a stack with the values under it so far, each anchor's
    expanded size kept when it closes, and the running total checked at every event."""
    expanded = 0
    anchors: dict[str, int] = {}
    open_anchors: set[str] = set()
    stack: list[list[Any]] = []  # [anchor, values under it so far, itself included] per open collection
    while loader.check_event():
        event = loader.get_event()
        if isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            if len(stack) >= MAX_YAML_DEPTH:
                raise YamlLimitError(f"nesting deeper than the limit of {MAX_YAML_DEPTH} levels")
            stack.append([event.anchor, 1])
            open_anchors.update([event.anchor] if event.anchor else [])
            size = 1
        elif isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
            anchor, closed = stack.pop()
            if anchor:
                anchors[anchor] = closed
                open_anchors.discard(anchor)
            if stack:
                stack[-1][1] += closed
            continue
        elif isinstance(event, yaml.ScalarEvent):
            size = 1
            if event.anchor:
                anchors[event.anchor] = 1
        elif isinstance(event, yaml.AliasEvent):
            if event.anchor in open_anchors:
                raise YamlLimitError(f"the alias *{event.anchor} is inside its own anchor (a structure that holds "
                                     "itself)")
            size = anchors.get(event.anchor, 1)  # an undefined alias: the loader names it
        else:
            continue
        if stack and not isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            stack[-1][1] += size
        expanded += size
        if expanded > MAX_YAML_NODES:
            raise YamlLimitError(f"more than the limit of {MAX_YAML_NODES} values once aliases are expanded "
                                 "(nested aliases?)")
    return expanded


def load_yaml(text: str, where: str, error: Error = ConfigError) -> Any:
    """``text`` loaded as plain data, within the limits.

    Raises:
        error: a limit passed (one line naming ``where`` and the limit).
        yaml.YAMLError: not valid YAML, or a tag that builds a non-plain type.
    """
    refuse_limits(text, where, error)
    return yaml.load(text, Loader=_PlainLoader)  # noqa: S506 - a SafeLoader subclass


def refuse_limits(text: str, where: str, error: Error = ConfigError) -> int:
    """``scan_yaml`` with a limit passed raised as ``error`` naming ``where``; returns the node count."""
    if len(text) > MAX_FILE_BYTES:
        raise error(f"{where}: refused: {len(text)} characters is more than the limit of {MAX_FILE_BYTES}")
    try:
        return scan_yaml(text)
    except YamlLimitError as exc:
        raise error(f"{where}: refused: {exc}; write the values out or simplify the file") from None
