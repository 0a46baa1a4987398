"""Integrations of ``stateremat.torch`` with model libraries (imported on demand, never by
``import stateremat``): :mod:`stateremat.integrations.transformers` and
:mod:`stateremat.integrations.timm`. Neither imports the library it serves; each works on the
models it is given through that library's public checkpointing hooks.
"""

__all__: list[str] = []
