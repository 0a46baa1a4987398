"""The paper's built-in workloads: stateful segment chains (§8–§10), the MoCo model and its data (§12)."""
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
from ._resnet import BasicBlock as BasicBlock, ResNet18 as ResNet18
from ._moco import MoCo as MoCo, QueueHead as QueueHead, SEGMENTS as MOCO_SEGMENTS, two_views as two_views
from ._datasets import (
    FASHION_MNIST_DIR as FASHION_MNIST_DIR,
    ImageData as ImageData,
    detect_dataset as detect_dataset,
    fit_validation_split as fit_validation_split,
    load_dataset as load_dataset,
)

__all__ = [
    "BasicBlock", "CPU_BYTES_FACTOR", "CPU_DIM_FACTOR", "FASHION_MNIST_DIR", "ImageData",
    "MOCO_SEGMENTS", "MoCo", "PRESETS", "QueueHead", "ResNet18", "StateSegment",
    "StatefulChain", "WORKLOADS", "WorkloadConfig", "detect_dataset", "fit_validation_split",
    "load_dataset", "loss_fn", "make_batch", "preset_budget", "preset_config", "scale",
    "two_views", "write_indices",
]
