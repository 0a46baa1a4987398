"""The five preservation engines of the NumPy reference (paper §3.1, Table 1).

One module each, one interface (:class:`Engine`): ``eager``, ``whole``, ``readset``,
``region``, ``guarded``. Each reports ``retained_bytes`` and ``workspace_bytes``.
"""
from ._base import Engine as Engine, Recovery as Recovery, backward as backward, forward as forward
from ._eager import EagerEngine as EagerEngine
from ._guarded import GuardedEngine as GuardedEngine
from ._readset import ReadSetEngine as ReadSetEngine
from ._region import RegionEngine as RegionEngine
from ._whole import WholeEngine as WholeEngine

__all__ = ["ENGINES", "EagerEngine", "Engine", "GuardedEngine", "ReadSetEngine", "Recovery",
           "RegionEngine", "WholeEngine", "backward", "forward", "make_engine"]

#: engine name -> class, in the order of Table 1
ENGINES = {c.name: c for c in (EagerEngine, WholeEngine, ReadSetEngine, RegionEngine, GuardedEngine)}


def make_engine(name: str, program, segments) -> Engine:
    """Build engine ``name`` for ``program`` split into ``segments``.

    Raises:
        ValueError: for an unknown name.
    """
    if name not in ENGINES:
        raise ValueError(f"stateremat.reference.engines.make_engine: unknown engine {name!r}; "
                         f"expected one of {list(ENGINES)}")
    return ENGINES[name](program, segments)
