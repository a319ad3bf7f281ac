"""The base of every section of the experiment config: unknown keys are errors naming the key,
and each field's docstring is its documentation."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)
