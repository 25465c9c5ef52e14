"""Deploy values: the defaults shipped in ``infra/deploy/values.yaml``, merged with the user's files and
``--set`` overrides, as Helm merges a chart's values.

Maps merge key by key; a list or a scalar replaces what it overrides (so ``args`` or ``tolerations``
given by a user are theirs, not an append). ``--set a.b.c=VALUE`` parses VALUE as YAML
(``--set services.tools.replicas=3``, ``--set hostNetwork=true``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from agentstream.streams.config.masking import mask_url
from agentstream.streams.core import resources
from agentstream.streams.core.errors import ConfigError

Values = dict[str, Any]


def _yaml() -> Any:
    from agentstream.streams.core.errors import MissingExtra

    try:
        import yaml
    except ModuleNotFoundError as exc:
        raise MissingExtra("deploy", "yaml", "agentstream deploy") from exc
    return yaml


def defaults_file() -> Path:
    return resources.infra_dir() / "deploy" / "values.yaml"


def merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> Values:
    """``override`` over ``base``: maps recursively, anything else replaced."""
    out: Values = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def parse_set(assignment: str) -> Values:
    """``a.b=1`` as ``{"a": {"b": 1}}`` (the value read as YAML)."""
    path, sep, raw = assignment.partition("=")
    if not sep or not path.strip():
        raise ConfigError(f"--set {mask_url(assignment)!r}: expected KEY.PATH=VALUE")
    value: Any = _yaml().safe_load(raw) if raw.strip() else ""
    for key in reversed(path.strip().split(".")):
        value = {key: value}
    out: Values = value
    return out


def load(files: Iterable[Path] = (), sets: Iterable[str] = ()) -> Values:
    """The shipped defaults, then each file in order, then each ``--set``."""
    yaml = _yaml()
    values: Values = yaml.safe_load(defaults_file().read_text())
    for path in files:
        try:
            data = yaml.safe_load(Path(path).read_text()) or {}
        except OSError as exc:
            raise ConfigError(f"cannot read values file {path}: {exc}") from exc
        except yaml.YAMLError as exc:
            raise ConfigError(f"values file {path} is not valid YAML: {exc}") from exc
        if not isinstance(data, Mapping):
            raise ConfigError(f"values file {path} must hold a mapping at the top, not {type(data).__name__}")
        values = merge(values, data)
    for assignment in sets:
        values = merge(values, parse_set(assignment))
    return values


__all__ = ["Values", "defaults_file", "load", "merge", "parse_set"]
