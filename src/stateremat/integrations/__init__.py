"""Integrations of ``stateremat.torch`` with model libraries and trainers (imported on demand,
never by ``import stateremat``): :mod:`stateremat.integrations.transformers`,
:mod:`stateremat.integrations.timm` and :mod:`stateremat.integrations.lightning`. The first two
do not import the library they serve (they work on the models they are given through that
library's public checkpointing hooks); the Lightning one imports Lightning, since a callback
subclasses its ``Callback``.
"""

__all__: list[str] = []
