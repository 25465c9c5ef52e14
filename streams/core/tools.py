"""What a tool is to the model, the submitter and the planner: its name, description, JSON-schema
parameters, whether a person approves its calls, and its metadata version. The catalogue
(``streams/catalog/tools.py``) keeps the current one per tool; the planner's prompts
(``streams/core/actions.py``) describe them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ToolInfo:
    """What the model and the submitter are told about a tool, and its metadata version."""

    name: str
    description: str
    parameters: dict[str, Any] = field(default_factory=dict)
    requires_approval: bool = False
    version: int = 1
