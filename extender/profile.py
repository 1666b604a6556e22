"""The scoring profile: which plugins filter and score, their weights and their arguments.

One YAML (or JSON) file, shaped like kube-scheduler's KubeSchedulerConfiguration profile so an
operator recognises it (`python -m extender --config FILE`; the manifests ship it as the
ConfigMap `power-aware-extender-config`)::

    apiVersion: power-aware-scheduler/v1alpha1
    kind: ExtenderConfiguration
    plugins:
      filter:
        enabled:
          - name: EnergyLevel
          - name: PowerCap
          - name: PowerState
      score:
        enabled:
          - name: PowerIncrease
            weight: 0.6
          - name: EnergyLevel
            weight: 0.4
        disabled:
          - name: SomeDefault        # or "*": start from no default plugin
    pluginConfig:
      - name: PowerIncrease
        args:
          pointsPerDoubling: 5
          minIncreaseW: 0.001

As in kube-scheduler, `enabled` adds to (or re-weights) the default plugins of that extension
point, `disabled` removes defaults, and `pluginConfig` gives a plugin its arguments, in
camelCase; the file may set only what differs from the defaults (the block above *is* the
default). Weights are relative (any scale, >= 0, not all 0). A plugin is named by its `name`,
for the plugins in `extender/plugins/` (found by scanning that package: adding one needs only
its module), or as `package.module:Class` for a plugin outside this repository.

Every error names the file and the key at fault (`plugins.score.enabled[1].weight`), and the
service refuses to start on one.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import pkgutil
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from extender.plugins.base import Plugin
from extender.state import NodeAttribute

API_VERSION = "power-aware-scheduler/v1alpha1"
KIND = "ExtenderConfiguration"
EXTENSION_POINTS = ("filter", "score")

# The defaults. (plugin name, weight) for score. PowerState filters by default: a node that
# is off, waking or draining must never get a pod, and without the annotation it passes.
DEFAULT_FILTERS: tuple[str, ...] = ("EnergyLevel", "PowerCap", "PowerState")
DEFAULT_SCORES: tuple[tuple[str, float], ...] = (("PowerIncrease", 0.6), ("EnergyLevel", 0.4))


class ProfileError(ValueError):
    """A configuration the extender cannot run with; the message names the key at fault."""


@dataclass(frozen=True, eq=False)
class Profile:
    """Enabled plugin instances, in order: filters, and score plugins with their weights."""

    filters: tuple[Plugin, ...]
    scores: tuple[tuple[Plugin, float], ...]
    source: str = "built-in defaults"

    def __post_init__(self) -> None:
        for plugin, weight in self.scores:
            if not (math.isfinite(weight) and weight >= 0):
                raise ProfileError(
                    f"weight of score plugin {plugin.name} must be finite and >= 0, got {weight!r}"
                )
        if self.scores and self.total_weight <= 0:
            raise ProfileError("score plugin weights must not all be 0")

    @property
    def total_weight(self) -> float:
        return sum(weight for _, weight in self.scores)

    @property
    def plugins(self) -> tuple[Plugin, ...]:
        """Every enabled plugin once, filters first (the order /explain lists their fields)."""
        seen: dict[int, Plugin] = {}
        for plugin in (*self.filters, *(p for p, _ in self.scores)):
            seen.setdefault(id(plugin), plugin)
        return tuple(seen.values())

    def plugin(self, name: str) -> Plugin:
        """The enabled plugin of that name; KeyError when it is not enabled."""
        for plugin in self.plugins:
            if plugin.name == name:
                return plugin
        raise KeyError(f"no enabled plugin named {name!r}")

    @property
    def weights(self) -> dict[str, float]:
        return {plugin.name: weight for plugin, weight in self.scores}

    @property
    def node_attributes(self) -> tuple[NodeAttribute, ...]:
        """The node attributes of every enabled plugin (their checks run at node writes)."""
        found: dict[int, NodeAttribute] = {}
        for plugin in self.plugins:
            for attribute in plugin.node_attributes:
                found.setdefault(id(attribute), attribute)
        return tuple(found.values())

    def describe(self) -> dict[str, Any]:
        """JSON-ready summary for `/status` and the start-up log."""
        return {
            "source": self.source,
            "filter": [plugin.name for plugin in self.filters],
            "score": [{"name": p.name, "weight": w} for p, w in self.scores],
            "args": {
                plugin.name: _camel_dict(dataclasses.asdict(plugin.args))
                for plugin in self.plugins
                if dataclasses.is_dataclass(plugin.args) and dataclasses.fields(plugin.args)
            },
        }

    def with_weights(self, **weights: float) -> Profile:
        """This profile with some score weights changed (by plugin name), e.g. from flags."""
        unknown = set(weights) - {plugin.name for plugin, _ in self.scores}
        if unknown:
            raise ProfileError(f"no enabled score plugin named {', '.join(sorted(unknown))}")
        scores = tuple((p, float(weights.get(p.name, w))) for p, w in self.scores)
        return Profile(self.filters, scores, self.source)


# ---- the plugin registry ------------------------------------------------------------------


def builtin_plugins() -> dict[str, type[Plugin]]:
    """Every plugin class defined in the `extender.plugins` package, by name."""
    import extender.plugins as package

    found: dict[str, type[Plugin]] = {}
    for module_info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{package.__name__}.{module_info.name}")
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and issubclass(value, Plugin)
                and value.name
                and value.__module__ == module.__name__
            ):
                found[value.name] = value
    return found


def plugin_class(name: str, registry: Mapping[str, type[Plugin]], where: str) -> type[Plugin]:
    """The class a configuration name stands for: a built-in, or `package.module:Class`."""
    if name in registry:
        return registry[name]
    if ":" in name:
        module_name, _, class_name = name.partition(":")
        try:
            value = getattr(importlib.import_module(module_name), class_name)
        except (ImportError, AttributeError) as exc:
            raise ProfileError(f"{where}: cannot load plugin {name!r}: {exc}") from None
        if not (isinstance(value, type) and issubclass(value, Plugin) and value.name):
            raise ProfileError(f"{where}: {name!r} is not a plugin class (extender.plugins.base)")
        return value
    raise ProfileError(
        f"{where}: unknown plugin {name!r}; known: {', '.join(sorted(registry))} "
        "(or package.module:Class)"
    )


# ---- building a profile ---------------------------------------------------------------------


def default_profile() -> Profile:
    """EnergyLevel, PowerCap and PowerState filter; PowerIncrease 0.6 + EnergyLevel 0.4 score."""
    return build_profile({}, source="built-in defaults")


def load_profile(path: Path | None) -> Profile:
    """The profile from a YAML/JSON file; the defaults when `path` is None."""
    if path is None:
        return default_profile()
    path = Path(path)
    try:
        document = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ProfileError(f"{path}: cannot read the configuration: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ProfileError(f"{path}: not valid YAML/JSON: {exc}") from None
    try:
        return build_profile(document if document is not None else {}, source=str(path))
    except ProfileError as exc:
        raise ProfileError(f"{path}: {exc}") from None


def build_profile(document: object, *, source: str = "configuration") -> Profile:
    """A profile from a parsed configuration document; ProfileError names the bad key."""
    doc = _mapping(document, "the configuration")
    _only_keys(doc, {"apiVersion", "kind", "plugins", "pluginConfig"}, "")
    if doc.get("apiVersion", API_VERSION) != API_VERSION:
        raise ProfileError(f"apiVersion: expected {API_VERSION!r}, got {doc['apiVersion']!r}")
    if doc.get("kind", KIND) != KIND:
        raise ProfileError(f"kind: expected {KIND!r}, got {doc['kind']!r}")
    registry = builtin_plugins()

    plugins = _mapping(doc.get("plugins", {}), "plugins")
    _only_keys(plugins, set(EXTENSION_POINTS), "plugins")
    filter_names = _enabled_names(
        plugins.get("filter", {}), "plugins.filter", [(n, None) for n in DEFAULT_FILTERS]
    )
    score_names = _enabled_names(plugins.get("score", {}), "plugins.score", list(DEFAULT_SCORES))

    args_by_name = _plugin_args(doc.get("pluginConfig", []))
    instances: dict[str, Plugin] = {}

    def instance(name: str, where: str, point: str) -> Plugin:
        cls = plugin_class(name, registry, where)
        if not cls.implements(point):
            raise ProfileError(f"{where}: plugin {name} is not a {point} plugin")
        if name not in instances:
            raw_args = args_by_name.pop(name, (None, {}))
            instances[name] = cls(_typed_args(cls, *raw_args))
        return instances[name]

    filters = tuple(instance(n, w, "filter") for n, _, w in filter_names)
    scores = []
    for name, weight, where in score_names:
        if weight is None:
            weight = 1.0  # as kube-scheduler: an enabled score plugin without weight counts 1
        if isinstance(weight, bool) or not isinstance(weight, int | float):
            raise ProfileError(f"{where}.weight: must be a number, got {weight!r}")
        if not (math.isfinite(weight) and weight >= 0):
            raise ProfileError(f"{where}.weight: must be finite and >= 0, got {weight!r}")
        scores.append((instance(name, where, "score"), float(weight)))
    if args_by_name:
        name, (where, _) = next(iter(args_by_name.items()))
        raise ProfileError(f"{where}: plugin {name} is configured but not enabled")
    try:
        return Profile(filters, tuple(scores), source)
    except ProfileError as exc:
        raise ProfileError(f"plugins.score: {exc}") from None


def _enabled_names(
    section: object, where: str, defaults: Sequence[tuple[str, float | None]]
) -> list[tuple[str, Any, str]]:
    """(name, weight, key path) of the enabled plugins: defaults - disabled + enabled."""
    section = _mapping(section, where)
    _only_keys(section, {"enabled", "disabled"}, where)
    disabled = {
        _plugin_name(entry, f"{where}.disabled[{i}]", weighted=False)[0]
        for i, entry in enumerate(_sequence(section.get("disabled", []), f"{where}.disabled"))
    }
    chosen: dict[str, tuple[Any, str]] = {}  # name -> (weight, key path), in order
    if "*" not in disabled:
        for name, weight in defaults:
            if name not in disabled:
                chosen[name] = (weight, f"{where} (default {name})")
    enabled: set[str] = set()
    for i, entry in enumerate(_sequence(section.get("enabled", []), f"{where}.enabled")):
        key = f"{where}.enabled[{i}]"
        name, weight = _plugin_name(entry, key, weighted=where.endswith("score"))
        if name in enabled:
            raise ProfileError(f"{key}: plugin {name} is enabled twice")
        enabled.add(name)
        # Enabling a default again keeps its place; a weight given replaces the default's.
        default_weight = chosen[name][0] if name in chosen else None
        chosen[name] = (weight if weight is not None else default_weight, key)
    return [(name, weight, key) for name, (weight, key) in chosen.items()]


def _plugin_name(entry: object, where: str, *, weighted: bool) -> tuple[str, Any]:
    entry = _mapping(entry, where)
    _only_keys(entry, {"name", "weight"} if weighted else {"name"}, where)
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise ProfileError(f"{where}.name: a plugin name is required, got {name!r}")
    return name, entry.get("weight")


def _plugin_args(section: object) -> dict[str, tuple[str, Mapping[str, Any]]]:
    args: dict[str, tuple[str, Mapping[str, Any]]] = {}
    for i, entry in enumerate(_sequence(section, "pluginConfig")):
        where = f"pluginConfig[{i}]"
        entry = _mapping(entry, where)
        _only_keys(entry, {"name", "args"}, where)
        name = entry.get("name")
        if not isinstance(name, str) or not name:
            raise ProfileError(f"{where}.name: a plugin name is required, got {name!r}")
        if name in args:
            raise ProfileError(f"{where}: plugin {name} is configured twice")
        args[name] = (f"{where}.args", _mapping(entry.get("args", {}), f"{where}.args"))
    return args


def _typed_args(cls: type[Plugin], where: str | None, raw: Mapping[str, Any]) -> Any:
    """The plugin's `Args` dataclass from camelCase keys; errors name the key."""
    where = where or f"pluginConfig ({cls.name}).args"
    fields = {_camel(f.name): f for f in dataclasses.fields(cls.Args)}
    values: dict[str, Any] = {}
    for key, value in raw.items():
        field = fields.get(key)
        if field is None:
            known = ", ".join(fields) or "none"
            raise ProfileError(f"{where}.{key}: unknown argument of {cls.name}; known: {known}")
        values[field.name] = _checked_value(value, field, f"{where}.{key}")
    try:
        return cls.Args(**values)
    except (TypeError, ValueError) as exc:
        raise ProfileError(f"{where}: {exc}") from None


def _checked_value(value: Any, field: dataclasses.Field, where: str) -> Any:
    """`value` converted to the field's declared scalar type, or a ProfileError."""
    kind = field.type if isinstance(field.type, str) else getattr(field.type, "__name__", "")
    if kind == "float":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ProfileError(f"{where}: must be a number, got {value!r}")
        return float(value)
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise ProfileError(f"{where}: must be a whole number, got {value!r}")
        return value
    if kind == "bool":
        if not isinstance(value, bool):
            raise ProfileError(f"{where}: must be true or false, got {value!r}")
        return value
    if kind == "str":
        if not isinstance(value, str):
            raise ProfileError(f"{where}: must be a string, got {value!r}")
        return value
    return value  # richer types: the Args dataclass checks them itself


def _camel(snake: str) -> str:
    head, *rest = snake.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def _camel_dict(values: Mapping[str, Any]) -> dict[str, Any]:
    return {_camel(key): value for key, value in values.items()}


def _mapping(value: object, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ProfileError(f"{where}: expected a mapping, got {type(value).__name__}")
    return value


def _sequence(value: object, where: str) -> Sequence[Any]:
    if not isinstance(value, list):
        raise ProfileError(f"{where}: expected a list, got {type(value).__name__}")
    return value


def _only_keys(mapping: Mapping[str, Any], allowed: Iterable[str], where: str) -> None:
    allowed = set(allowed)
    for key in mapping:
        if key not in allowed:
            prefix = f"{where}." if where else ""
            raise ProfileError(
                f"{prefix}{key}: unknown key; expected one of {', '.join(sorted(allowed))}"
            )


DEFAULT_PROFILE = default_profile()
