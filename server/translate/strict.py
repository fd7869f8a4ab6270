"""The one base of every request body part: unknown fields and loose types are 400s naming them.

Every API's bodies derive from it, so a typo (``num_beam``) is refused the same way on every route;
``populate_by_name`` lets a field whose JSON name is a Python keyword or shadows a pydantic name
(``schema``, ``json``) be declared as ``schema_`` with an alias.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)
