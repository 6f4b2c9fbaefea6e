"""Handler settings from the archive's model-config.yaml (`handler:` section).

Handlers run on stock TorchServe, which does not ship pydantic, so settings
are plain dataclasses checked here: unknown keys are rejected with a
"did you mean" hint and values are converted to the declared type.
"""

import dataclasses
import difflib
import typing


def parse_settings(cls, raw: dict):
    """Build dataclass `cls` from `raw`, refusing keys it does not declare."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    errors = []
    values = {}
    hints = typing.get_type_hints(cls)
    for key, value in raw.items():
        if key not in fields:
            close = difflib.get_close_matches(key, fields, n=1)
            errors.append(f"handler.{key}: unknown setting" + (f" — did you mean {close[0]!r}?" if close else ""))
            continue
        kind = hints[key]
        origin = typing.get_origin(kind) or kind
        if origin is bool and not isinstance(value, bool):
            errors.append(f"handler.{key}: expected true or false (got {value!r})")
            continue
        try:
            values[key] = value if origin in (list, tuple, dict) or isinstance(value, origin) else origin(value)
        except (TypeError, ValueError):
            errors.append(f"handler.{key}: expected {origin.__name__} (got {value!r})")
    if errors:
        raise ValueError("; ".join(errors))
    return cls(**values)
