"""The contract of pluggable components (client methods, server strategies): one registry
mechanism and one set of parameter rules for both (no Flower here). The same
:class:`Rule` declares the allowed values of the experiment's own keys
(:data:`fedrcl_flwr.config.CONFIG_RULES`).

A component's class (a file of ``clients/`` or ``strategies/``, registered by name in
``clients/__init__.py`` / ``strategies/__init__.py``) declares its parameters as
``defaults`` (name -> default value) and, next to them, ``rules`` (name -> :class:`Rule`)
for the allowed values; the registry reads both from the class (:meth:`Registry.params`).
The *type* of a parameter is its default's type and is enforced for every key:

* ``bool``  - ``true`` / ``false`` only (no ``0`` / ``1``);
* ``int``   - whole numbers only (``2.0`` and ``true`` are rejected);
* ``float`` - any number, converted to ``float``; NaN and +-Inf are rejected;
* ``str``   - text; ``list`` - a YAML list (no non-finite numbers inside).

``rules`` adds ranges / choices / predicates; a rule may also need the configured model
(``model_check``: e.g. FedRCL's ``levels`` must be taps the model has). Everything is
checked by :func:`fedrcl_flwr.app.validate.validate_components` when the config is loaded,
before any Flower process starts, and a bad value is one :class:`ConfigError` line naming
the key and the file.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fedrcl_flwr.errors import ConfigError, shown


@dataclass(frozen=True)
class Rule:
    """Allowed values of one parameter: ``ok(value)`` must hold (after the type check);
    ``text`` says what is allowed ("must be > 0"); ``bad`` are invalid examples the
    contract test feeds in; ``model_check(value, get_model)`` returns an error text or
    None, calling ``get_model()`` (the configured model, built on first use; ``None`` if it
    cannot be built) only for values that depend on the model."""

    ok: Callable[[Any], bool]
    text: str
    bad: tuple = ()
    model_check: Callable[[Any, Any], str | None] | None = None


def between(
    lo: float | None = None,
    hi: float | None = None,
    *,
    lo_open: bool = False,
    hi_open: bool = False,
    also: tuple = (),
) -> Rule:
    """A number in [lo, hi] (open ends with ``lo_open`` / ``hi_open``); ``also`` lists
    sentinel values allowed outside it (e.g. ``-1`` = "use the schedule")."""

    def ok(v):
        if v in also:
            return True
        if lo is not None and (v <= lo if lo_open else v < lo):
            return False
        return not (hi is not None and (v >= hi if hi_open else v > hi))

    left = "(" if lo_open else "["
    right = ")" if hi_open else "]"
    span = f"{left}{'-inf' if lo is None else lo}, {'inf' if hi is None else hi}{right}"
    if hi is None and lo is not None:
        span = f"> {lo}" if lo_open else f">= {lo}"
    text = f"must be {span}" if span.startswith((">", "<")) else f"must be in {span}"
    if also:
        text += f" (or {', '.join(map(str, also))})"
    bad = []
    step = lambda b: 1 if isinstance(b, int) else 0.5  # noqa: E731 - stay in the type
    if lo is not None:
        bad.append(lo if lo_open else lo - step(lo))
    if hi is not None:
        bad.append(hi if hi_open else hi + step(hi))
    bad = [b for b in bad if b not in also]
    return Rule(ok, text, tuple(bad))


def positive() -> Rule:
    return between(0, lo_open=True)


def non_negative() -> Rule:
    return between(0)


def at_least(lo: int) -> Rule:
    return between(lo)


def one_of(*choices: str) -> Rule:
    return Rule(lambda v: v in choices, f"must be one of {', '.join(choices)}", ("no-such-choice",))


def with_text(rule: Rule, text: str) -> Rule:
    """``rule`` saying what is allowed in other words (e.g. with the unit: ``must be in
    [0, 180] degrees``)."""
    return dataclasses.replace(rule, text=text)


def or_null(rule: Rule) -> Rule:
    """``rule`` whose text says that null is allowed too (for a key whose annotation is
    ``Optional``: null never reaches a rule)."""
    return with_text(rule, rule.text + " (or null)")


def _finite(v: Any) -> bool:
    if isinstance(v, float):
        return math.isfinite(v)
    if isinstance(v, (list, tuple)):
        return all(_finite(x) for x in v)
    if isinstance(v, dict):
        return all(_finite(x) for x in v.values())
    return True


def _typed(value: Any, default: Any) -> tuple[bool, Any]:
    """``(ok, value converted to the default's type)``."""
    if isinstance(default, bool):
        return isinstance(value, bool), value
    if isinstance(default, int):
        return isinstance(value, int) and not isinstance(value, bool), value
    if isinstance(default, float):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return ok, float(value) if ok else value
    if isinstance(default, str):
        return isinstance(value, str), value
    if isinstance(default, list):
        return isinstance(value, list), list(value) if isinstance(value, list) else value
    return True, value


def type_text(default: Any) -> str:
    for tp, name in (
        (bool, "true or false"),
        (int, "a whole number"),
        (float, "a number"),
        (str, "a string"),
        (list, "a list"),
    ):
        if isinstance(default, tp):
            return name
    return type(default).__name__


def resolve_params(
    section: str, owner: str, defaults: dict, rules: dict, given: dict | None
) -> dict:
    """``given`` merged over ``defaults`` with every value checked (type, finiteness,
    rule); unknown keys are an error. ``section`` is ``client.params`` / ``server.params``,
    ``owner`` names the component ("method 'fedrcl'")."""
    given = dict(given or {})
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        allowed = ", ".join(sorted(defaults)) or "(none)"
        raise ConfigError(
            f"{section}: unknown key(s) {', '.join(map(str, unknown))} for "
            f"{owner} (allowed: {allowed})"
        )
    out = dict(defaults)
    for k, v in given.items():
        ok, v = _typed(v, defaults[k])
        if not ok:
            raise ConfigError(
                f"{section}.{k} for {owner} must be {type_text(defaults[k])}, got {shown(v)}"
            )
        if not _finite(v):
            raise ConfigError(f"{section}.{k} for {owner} must be finite, got {shown(v)}")
        rule = rules.get(k)
        if rule is not None and not rule.ok(v):
            raise ConfigError(f"{section}.{k} for {owner} {rule.text}, got {shown(v)}")
        out[k] = v
    return out


def check_model_rules(
    section: str, owner: str, rules: dict, params: dict, get_model: Callable[[], Any]
) -> None:
    """Run the rules that depend on the configured model (``model_check``)."""
    for k, rule in rules.items():
        if rule.model_check is not None:
            why = rule.model_check(params[k], get_model)
            if why:
                raise ConfigError(f"{section}.{k} for {owner}: {why}")


def type_violations(default: Any) -> list:
    """Values of the wrong type for a parameter with this default (contract tests)."""
    if isinstance(default, bool):
        return ["yes", 1]
    if isinstance(default, int):
        return [1.5, "3", True]
    if isinstance(default, float):
        return ["0.1x", True, float("nan"), float("inf")]
    if isinstance(default, str):
        return [3, ["a"]]
    if isinstance(default, list):
        return ["all", [float("nan")]]
    return []


EXTRA_COMPONENTS_ENV = "FEDRCL_FLWR_EXTRA_COMPONENTS"


def extra_components(key: str) -> dict[str, str]:
    """Components registered from outside the package for the registry selected by
    ``key``: the environment variable :data:`EXTRA_COMPONENTS_ENV` holds JSON
    ``{"client.method": {"name": "module:Class"}, ...}``. It reaches every process a run
    starts (the CLI, the SuperLink, the ServerApp, the ClientApps, Ray's workers), which
    is how the test suite registers its test doubles (``tests/conftest.py``: the
    ``faulty`` client method) without them in the production registries."""
    import json
    import os

    text = os.environ.get(EXTRA_COMPONENTS_ENV, "").strip()
    if not text:
        return {}
    try:
        entries = json.loads(text).get(key, {})
        ok = isinstance(entries, dict) and all(
            isinstance(k, str) and isinstance(v, str) and v.count(":") == 1
            for k, v in entries.items()
        )
    except (ValueError, AttributeError):
        ok = False
    if not ok:
        raise ConfigError(
            f'{EXTRA_COMPONENTS_ENV}: must be JSON {{"{key}": {{"name": '
            f'"module:Class"}}}}, got {text[:200]!r}'
        )
    return dict(entries)


class Registry(dict):
    """Name -> ``"module:Class"`` of one kind of component, the class imported lazily (one
    broken component cannot break the others); ``key`` is the config key that selects
    one. A component declares its parameters on its class (``defaults``: name -> default
    value, whose type is the parameter's; ``rules``: name -> :class:`Rule`), next to the
    code that uses them; :meth:`params` reads them there. ``builtin`` are the package's own
    entries; others come from :meth:`register` (this process) or :func:`extra_components`
    (the environment: every process of a run)."""

    def __init__(self, key: str, entries: dict[str, str]):
        super().__init__()
        self.key = key
        for name, target in entries.items():
            self.register(name, target)
        self.builtin = frozenset(entries)
        for name, target in extra_components(key).items():
            self.register(name, target)

    def register(self, name: str, target: str) -> None:
        """Add component ``name`` = ``"module:Class"`` in this process (a process a run
        starts needs :data:`EXTRA_COMPONENTS_ENV` too)."""
        if not isinstance(target, str) or target.count(":") != 1:
            raise ValueError(f"{self.key} '{name}': target must be 'module:Class', got {target!r}")
        self[name] = target

    def target(self, name: str) -> str:
        """``"module:Class"`` of component ``name`` (one line naming the choices if unknown)."""
        if name not in self:
            raise ConfigError(
                f"'{self.key}' must be one of {', '.join(sorted(self))}, got {shown(name)}"
            )
        return self[name]

    def load(self, name: str):
        module, cls = self.target(name).split(":")
        return getattr(importlib.import_module(module), cls)

    def params(self, name: str) -> tuple[dict, dict]:
        """``(defaults, rules)`` as component ``name``'s class declares them (this imports
        the class)."""
        cls = self.load(name)
        return cls.defaults, cls.rules


# ----------------------------------------------------------- rules about the model's taps
def model_taps(model) -> tuple:
    """Names ``model(x, return_features=True)`` returns: its ``levels`` + ``penultimate``
    (``model`` follows ``fedrcl_flwr.models.interface.FeatureModel``)."""
    levels = tuple(model.levels)
    return levels + (() if "penultimate" in levels else ("penultimate",))


def feature_tap() -> Rule:
    """A feature name the configured model returns (``penultimate``, a level name)."""

    def check(v, get_model):
        model = None if v == "penultimate" else get_model()  # every model has penultimate
        if model is None:
            return None
        taps = model_taps(model)
        return None if v in taps else f"unknown feature {v!r}; this model has {list(taps)}"

    return Rule(lambda v: bool(v), "must name a feature of the model", ("no_such_feature",), check)


def resolve_levels(requested: list, model_levels: tuple) -> list[str]:
    """``[all]`` (or ``[]``) = every level, ``[last]`` = the last one, else the names given
    (each must be one of ``model_levels``)."""
    if requested in (["all"], []):
        return list(model_levels)
    if requested == ["last"]:
        return [model_levels[-1]]
    bad = [lv for lv in requested if lv not in model_levels]
    if bad:
        raise ConfigError(
            f"client.params.levels: unknown level(s) {bad}; this model has "
            f"{list(model_levels)} (or use [all] / [last])"
        )
    return list(requested)


def tap_levels() -> Rule:
    """A list of the model's level names, or ``[all]`` / ``[last]``."""

    def check(v, get_model):
        model = None if v in (["all"], [], ["last"]) else get_model()
        if model is None:
            return None
        try:
            resolve_levels(v, tuple(model.levels))
        except ConfigError as exc:
            return str(exc).split(": ", 1)[1]
        return None

    return Rule(
        lambda v: all(isinstance(x, str) and x for x in v),
        "must be a list of level names, [all] or [last]",
        (["nonexistent"], [3]),
        check,
    )


# ------------------------------------------------------- rules about the model's blocks
def resolve_branches(req: list, n_blocks: int) -> list[int]:
    """Block indices that get a hybrid branch: ``[all]`` (or ``[]``) = every block."""
    if req in (["all"], []):
        return list(range(n_blocks))
    bad = [k for k in req if not 0 <= k < n_blocks]
    if bad:
        raise ConfigError(f"client.params.branches: {bad} not in [0, {n_blocks}) (or use [all])")
    return sorted(set(req))


def block_indices() -> Rule:
    """``[all]`` or a list of indices of the model's blocks (FedMLB's ``branches``)."""

    def check(req, get_model):
        import torch

        from fedrcl_flwr.models.interface import has_blocks

        model = None if req in (["all"], []) else get_model()
        if model is None or not has_blocks(model):
            return None  # the method's check_config says so
        with torch.no_grad():
            n = len(model.block_forward(torch.zeros(2, *model.probe_input_shape)))
        try:
            resolve_branches(req, n)
        except ConfigError as exc:
            return str(exc).split(": ", 1)[1]
        return None

    return Rule(
        lambda v: v == ["all"] or all(isinstance(k, int) and not isinstance(k, bool) for k in v),
        "must be [all] or a list of block indices",
        (["first"], [99], [-1]),
        check,
    )


def finch_level() -> Rule:
    """A level of a FINCH clustering: ``finest``, ``coarsest`` or an index (0, 1, ...)."""
    return Rule(
        lambda v: v in ("finest", "coarsest") or v.isdigit(),
        "must be finest, coarsest or a FINCH level index (0, 1, ...)",
        ("middle", "-1"),
    )
