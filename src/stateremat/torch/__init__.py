"""stateremat.torch (see DESIGN.md, layer `torch`)."""
from ._memory import PeakMemory as PeakMemory, memory_method as memory_method, storage_bytes as storage_bytes  # issue 5
