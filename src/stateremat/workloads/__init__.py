"""stateremat.workloads (see DESIGN.md, layer `workloads`): stateful segment chains (paper §8–§10)."""
from ._config import (
    CPU_BYTES_FACTOR as CPU_BYTES_FACTOR,
    CPU_DIM_FACTOR as CPU_DIM_FACTOR,
    PRESETS as PRESETS,
    WORKLOADS as WORKLOADS,
    WorkloadConfig as WorkloadConfig,
    preset_budget as preset_budget,
    preset_config as preset_config,
    scale as scale,
)
from ._chain import (
    StateSegment as StateSegment,
    StatefulChain as StatefulChain,
    loss_fn as loss_fn,
    make_batch as make_batch,
    write_indices as write_indices,
)
from ._resnet import BasicBlock as BasicBlock, ResNet18 as ResNet18  # issue 6
from ._moco import MoCo as MoCo, QueueHead as QueueHead, SEGMENTS as MOCO_SEGMENTS, two_views as two_views  # issue 6
from ._datasets import ImageData as ImageData, fit_validation_split as fit_validation_split, load_dataset as load_dataset  # issue 6
