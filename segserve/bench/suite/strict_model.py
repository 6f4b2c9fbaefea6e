"""The base of every model of a suite file: unknown keys refused, a field's docstring its description."""

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    # a field's docstring is its description: in the JSON Schema and the generated suite reference
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)
