"""The paper's method names and the library options they stand for: one table.

A fixed method runs one option on every segment; its paper name can differ from the option's
(``regions`` runs ``region``). The bench, MoCo and the reports look the option up here.
"""
from __future__ import annotations

from ..contract import OPTIONS

#: Fixed methods named after the option they use everywhere (``regions`` uses ``region``).
METHOD_OPTION = {"eager": "eager", "whole": "whole", "regions": "region"}
#: Display names of the methods that are not one option everywhere.
_OTHER_LABELS = {
    "functional": "Functional",
    "state_agnostic": "State-agnostic planner",
    "eager_whole": "State-aware eager/whole",
    "joint": "Joint planner",
}


def method_label(method: str) -> str:
    """Display name of ``method``: a fixed method's option label (:data:`OPTIONS`), else its
    planner's name (the raw name if unknown)."""
    option = METHOD_OPTION.get(method)
    if option is not None and option in OPTIONS:
        return OPTIONS[option].label
    return _OTHER_LABELS.get(method, method)
