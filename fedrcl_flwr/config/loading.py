"""Reading experiments: the project's one YAML reader and text-file reader, dotted
overrides, and building the typed schema from a mapping with every check.

Reading YAML (files and ``--set`` values alike, one loader, :class:`_Loader`): the file must
be UTF-8 and at most :data:`MAX_YAML_BYTES`; a key given twice in one mapping (at any
level) is an error naming the key and both lines; anchors/aliases may not expand to more
than :data:`MAX_YAML_NODES` nodes (an "alias bomb" is refused before anything is copied);
floats are read as a person writes them (``1e-3``, ``1E-3``, ``.5``, ``-2.5e+4`` are floats,
not strings as under YAML 1.1). Every float in the schema must be finite (``inf``/``nan``
are refused).

Overrides use dotted keys, e.g. ``client.lr=0.05`` or ``partition.alpha=0.1``; values are
parsed as YAML scalars (``true``, ``0.3``, ``[0, 1]``, ``null``) and then validated like
keys in the file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import functools
import math
import os
import re
import types
import typing
from pathlib import Path
from typing import Any, Union

import yaml

from fedrcl_flwr.config.checks import check_config
from fedrcl_flwr.config.schema import ExperimentConfig
from fedrcl_flwr.errors import ConfigError, file_mode_kind, shown

MAX_YAML_BYTES = 1 << 20  # an experiment file is a few KB; refuse anything over 1 MiB
MAX_YAML_NODES = 100_000  # nodes after alias expansion (a config has a few hundred)


class _Loader(yaml.SafeLoader):
    """SafeLoader + duplicate-key errors + YAML 1.2 floats + a bound on alias expansion."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                hash(key)
            except TypeError:
                raise yaml.constructor.ConstructorError(
                    None, None, f"unhashable key {key!r}", key_node.start_mark
                ) from None
            line = key_node.start_mark.line + 1
            if key in seen:
                raise ConfigError(
                    f"key '{key}' appears twice in the same mapping (lines {seen[key]} and {line})"
                )
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def _resolve_float(loader_cls: Any) -> None:
    # drop the YAML 1.1 float resolver and add one for 1e-3, 1E-3, .5, 1., -2.5e+4 (and .inf/.nan,
    # which the schema then refuses with a clear message)
    for ch, resolvers in list(loader_cls.yaml_implicit_resolvers.items()):
        loader_cls.yaml_implicit_resolvers[ch] = [
            (tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:float"
        ]
    rx = re.compile(
        r"""^(?:[-+]?(?:\.[0-9]+|[0-9]+\.[0-9]*|[0-9]+(?=[eE]))"""
        r"""(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"""
    )
    loader_cls.add_implicit_resolver("tag:yaml.org,2002:float", rx, list("-+0123456789."))


_Loader.yaml_implicit_resolvers = {
    k: list(v) for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_resolve_float(_Loader)


class _RecursiveAlias(Exception):
    def __init__(self, node: Any) -> None:
        self.node = node


def _expanded_size(node: Any, memo: dict) -> int:
    """Nodes in the tree ``node`` stands for once aliases are expanded (memoised, so an
    alias bomb is measured without being expanded). A node that contains itself (a
    recursive alias, ``&a {x: *a}``) raises :class:`_RecursiveAlias`: no configuration
    is an infinite tree, and every later step (copying, hashing, printing) would recurse
    forever on one."""
    key = id(node)
    if key in memo:
        if memo[key] is None:  # still being measured: the node contains itself
            raise _RecursiveAlias(node)
        return memo[key]
    memo[key] = None
    size = 1
    if isinstance(node, yaml.SequenceNode):
        size += sum(_expanded_size(n, memo) for n in node.value)
    elif isinstance(node, yaml.MappingNode):
        size += sum(_expanded_size(k, memo) + _expanded_size(v, memo) for k, v in node.value)
    memo[key] = size
    return size


def parse_yaml(text: str, source: str) -> Any:
    """The one YAML reader of the project (files and ``--set`` values)."""
    try:
        loader = _Loader(text)
        try:
            node = loader.get_single_node()
            if node is None:
                return None
            try:
                size = _expanded_size(node, {})
            except _RecursiveAlias as rec:
                raise ConfigError(
                    f"{source}: line {rec.node.start_mark.line + 1}: a "
                    "recursive alias (an anchor used inside itself) is not "
                    "allowed"
                ) from None
            if size > MAX_YAML_NODES:
                raise ConfigError(
                    f"{source}: YAML expands to {size} nodes through anchors/"
                    f"aliases (at most {MAX_YAML_NODES} allowed)"
                )
            return loader.construct_document(node)
        finally:
            loader.dispose()
    except ConfigError as exc:
        msg = str(exc)
        raise ConfigError(msg if msg.startswith(source) else f"{source}: {msg}") from None
    except (yaml.YAMLError, RecursionError) as exc:
        one = " ".join(str(exc).replace('in "<unicode string>", ', "").split())
        raise ConfigError(f"{source}: not valid YAML ({one})") from None


# --------------------------------------------------------------------------------------
# Building dataclasses from mappings, with checks
# --------------------------------------------------------------------------------------


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        null = " or null" if type(None) in typing.get_args(tp) else ""
        return " or ".join(_type_name(a) for a in args) + null
    if origin is not None:
        return origin.__name__
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, key: str, source: str) -> Any:
    """Check ``value`` against annotation ``tp``; ints are accepted for floats."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        if isinstance(value, dict):  # a section: its own keys' errors name the full key
            for arg in args:
                if isinstance(arg, type) and dataclasses.is_dataclass(arg):
                    return _build(arg, value, key, source)
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key, source)
            except ConfigError as exc:
                if "finite" in str(exc):
                    raise
        raise ConfigError(
            f"{source}: '{key}' must be {_type_name(tp)}, got {type(value).__name__} ({shown(value)})"
        )
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(float(value)):
                raise ConfigError(f"{source}: '{key}' must be a finite number, got {shown(value)}")
            return float(value)
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is str:
        if isinstance(value, str):
            return value
    elif tp is dict or origin is dict:
        if isinstance(value, dict):
            return dict(value)
        if value is None:
            return {}
    elif tp is list or origin is list:
        if isinstance(value, list):
            return list(value)
    elif isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if value is None:
            value = {}
        if isinstance(value, dict):
            return _build(tp, value, key, source)
    else:  # pragma: no cover - schema uses only the types above
        return value
    raise ConfigError(
        f"{source}: '{key}' must be {_type_name(tp)}, got {type(value).__name__} ({shown(value)})"
    )


@functools.cache
def _schema_of(cls: type) -> tuple[dict, frozenset]:
    """A section class's annotations (resolved) and field names, read once per class."""
    return typing.get_type_hints(cls), frozenset(f.name for f in dataclasses.fields(cls))


def _build(cls: type, data: dict, prefix: str, source: str) -> Any:
    hints, names = _schema_of(cls)
    for k in data:
        if k not in names:
            where = f"{prefix}.{k}" if prefix else str(k)
            allowed = ", ".join(sorted(names))
            close = difflib.get_close_matches(str(k), sorted(names), n=1, cutoff=0.6)
            hint = f"did you mean '{prefix + '.' if prefix else ''}{close[0]}'? " if close else ""
            raise ConfigError(f"{source}: unknown key '{where}' ({hint}allowed here: {allowed})")
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name in data:
            key = f"{prefix}.{f.name}" if prefix else f.name
            kwargs[f.name] = _coerce(data[f.name], hints[f.name], key, source)
    return cls(**kwargs)


# --------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------


def get_key(cfg: Any, dotted: str) -> Any:
    obj = cfg
    for part in dotted.split("."):
        obj = obj[part] if isinstance(obj, dict) else getattr(obj, part)
    return obj


def parse_override(text: str) -> tuple[str, Any]:
    """Parse ``key=value`` (value as a YAML scalar/list) into ``(key, value)``."""
    if "=" not in text:
        raise ConfigError(f"override '{text}' must look like key=value")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"override '{text}' has an empty key")
    value = parse_yaml(raw, f"override '{text}'") if raw.strip() != "" else ""
    return key, value


def key_problem(key: Any) -> str | None:
    """Why ``key`` is not a dotted config key (``section.key``: names joined by ``.``,
    none empty, none with spaces around it or a ``/``), or ``None``."""
    if not isinstance(key, str) or not key:
        return "is not a dotted config key (section.key)"
    for part in key.split("."):
        if not part:
            return "has an empty name between dots (a dotted config key is section.key)"
        if part != part.strip():
            return f"has spaces around the name {shown(part, 40)}"
        if "/" in part or "\\" in part:
            return "holds a path separator (a dotted config key is section.key, not a path)"
    return None


def apply_overrides(data: dict, overrides: list[str] | list[tuple[str, Any]]) -> dict:
    """Apply dotted overrides to a raw mapping (before validation); a key that is not a
    dotted config key (:func:`key_problem`) is a :class:`ConfigError`."""
    data = _deepcopy(data)
    for item in overrides:
        key, value = parse_override(item) if isinstance(item, str) else item
        why = key_problem(key)
        if why:
            raise ConfigError(f"override {shown(key)} {why}")
        node = data
        parts = key.split(".")
        for part in parts[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError(f"override '{key}': '{part}' is not a section")
            node = child
        node[parts[-1]] = value
    return data


def _deepcopy(d: Any) -> Any:
    if isinstance(d, dict):
        return {k: _deepcopy(v) for k, v in d.items()}
    if isinstance(d, list):
        return [_deepcopy(v) for v in d]
    return d


def config_from_dict(data: dict, source: str = "<config>") -> ExperimentConfig:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: top level must be a mapping of sections")
    cfg = _build(ExperimentConfig, data, "", source)
    check_config(cfg, source)
    return cfg


def read_text_file(
    path: Path, limit: int, what: str, *, label: str | None = None, error: type = ConfigError
) -> str:
    """The project's one reader of text files it is given (experiments, sweeps, run
    files, split files): a regular file (not a directory, device or FIFO) of at most
    ``limit`` bytes — checked before reading — decoded as UTF-8. Any problem is one
    ``error`` (a :class:`ConfigError`) starting with ``label`` (default: the path);
    ``what`` names the kind of file in the size message."""
    path = Path(path)
    label = str(path) if label is None else label
    try:
        if not path.is_file():
            kind = file_kind(path)
            raise error(
                f"{label}: not a regular file ({kind})" if kind else f"{label}: no such file"
            )
        size = path.stat().st_size
        if size > limit:
            raise error(f"{label}: {size} bytes is too large for {what} (at most {limit} bytes)")
        raw = path.read_bytes()
    except OSError as exc:
        raise error(f"{label}: cannot read ({exc.strerror or exc})") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise error(
            f"{label}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at line "
            f"{line}); save the file as UTF-8"
        ) from None


def file_kind(path: Path) -> str | None:
    """What ``path`` is when it is not a regular file: ``a directory``, ``a FIFO``, ...;
    ``None`` when nothing is there."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return "a broken link" if path.is_symlink() else None
    return file_mode_kind(mode)


def read_yaml(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        kind = file_kind(path)
        if kind is not None:  # a FIFO would block a reader: refused, not opened
            raise ConfigError(f"{path}: not an experiment file ({kind}); give a YAML file")
        raise ConfigError(f"experiment file not found: {path}")
    text = read_text_file(path, MAX_YAML_BYTES, "an experiment file")
    data = parse_yaml(text, str(path))
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping of sections")
    return data


def load_config(path: str | Path, overrides: list[str] | None = None) -> ExperimentConfig:
    """Load, override and validate an experiment YAML file."""
    data = read_yaml(path)
    if overrides:
        data = apply_overrides(data, overrides)
        source = f"{path} (with overrides)"
    else:
        source = str(path)
    return config_from_dict(data, source)


def to_dict(cfg: ExperimentConfig) -> dict:
    return dataclasses.asdict(cfg)


def flatten_keys(d: Any, prefix: str = "") -> dict:
    """Dotted keys of the leaves; an empty mapping has none (``params: {}`` and a missing
    ``params`` are the same setting)."""
    if isinstance(d, dict):
        out = {}
        for k, v in d.items():
            out.update(flatten_keys(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: d}


def dump_config(cfg: ExperimentConfig, path: str | Path) -> None:
    """Write the resolved config (after defaults and overrides) as YAML: into a new
    file ``PATH.tmp`` (what had that name removed first, created with ``O_EXCL |
    O_NOFOLLOW``), then renamed over ``path``, so a link at either name is replaced,
    never written through."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        with os.fdopen(os.open(tmp, flags, 0o644), "w") as fh:
            fh.write(yaml.safe_dump(to_dict(cfg), sort_keys=False))
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
