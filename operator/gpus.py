"""GPU memory per product, for the fit check.

Figures are the total memory CUDA reports for one device (`nvidia-smi --query-gpu=memory.total`,
in MiB), which is what vLLM multiplies by gpu_memory_utilization, not the marketing size.
Keys are the values GPU feature discovery puts in the node label `nvidia.com/gpu.product`
(the product name with spaces as dashes), which is also what `spec.resources.gpuProduct` holds.
"""

from __future__ import annotations

from dataclasses import dataclass

MIB = 1 << 20


@dataclass(frozen=True)
class GPU:
    """One GPU product: its node-label name and total device memory."""

    product: str
    memory_mib: int
    aliases: tuple[str, ...] = ()

    @property
    def memory_bytes(self) -> int:
        """Total device memory in bytes."""
        return self.memory_mib * MIB


GPUS: tuple[GPU, ...] = (
    GPU("NVIDIA-B200", 183_359, ("B200",)),
    GPU("NVIDIA-H200", 143_771, ("H200", "NVIDIA-H200-SXM", "H200-SXM")),
    GPU("NVIDIA-H200-NVL", 143_771, ("H200-NVL",)),
    GPU("NVIDIA-H100-80GB-HBM3", 81_559, ("H100", "H100-SXM", "NVIDIA-H100-SXM5-80GB", "H100-80GB")),
    GPU("NVIDIA-H100-PCIe", 81_559, ("H100-PCIE",)),
    GPU("NVIDIA-H100-NVL", 95_830, ("H100-NVL",)),
    GPU("NVIDIA-GH200-480GB", 97_871, ("GH200",)),
    GPU("NVIDIA-A100-SXM4-80GB", 81_920, ("A100-80GB", "A100-SXM4-80GB", "NVIDIA-A100-80GB-PCIe")),
    GPU("NVIDIA-A100-SXM4-40GB", 40_960, ("A100", "A100-40GB", "A100-SXM4-40GB", "NVIDIA-A100-PCIE-40GB")),
    GPU("NVIDIA-L40S", 46_068, ("L40S",)),
    GPU("NVIDIA-L40", 46_068, ("L40",)),
    GPU("NVIDIA-L4", 23_034, ("L4",)),
    GPU("NVIDIA-A10G", 23_028, ("A10G",)),
    GPU("NVIDIA-A10", 23_028, ("A10",)),
    GPU("Tesla-T4", 15_360, ("T4", "NVIDIA-T4")),
    GPU("Tesla-V100-SXM2-32GB", 32_768, ("V100-32GB",)),
    GPU("Tesla-V100-SXM2-16GB", 16_384, ("V100", "V100-16GB")),
    GPU("NVIDIA-GeForce-RTX-4090", 24_564, ("RTX-4090",)),
)

_INDEX = {key.upper(): gpu for gpu in GPUS for key in (gpu.product, *gpu.aliases)}


SHARED_SUFFIX = "-SHARED"


def lookup(product: str | None) -> GPU | None:
    """The GPU for a product label or a short alias (case-insensitive), or None when unknown.

    A `-SHARED` suffix (time-sliced GPUs in GPU feature discovery) is ignored.
    """
    if not product:
        return None
    key = product.strip().upper().removesuffix(SHARED_SUFFIX)
    return _INDEX.get(key)


def node_label_value(product: str) -> str:
    """The `nvidia.com/gpu.product` value nodes with this GPU carry: `H200` -> `NVIDIA-H200`.

    A known product or alias becomes the name GPU feature discovery writes (keeping a `-SHARED`
    suffix, which GFD adds for time-sliced GPUs); an unknown product is taken as the label value.
    """
    gpu = lookup(product)
    if gpu is None:
        return product
    shared = product.strip().upper().endswith(SHARED_SUFFIX)
    return gpu.product + (SHARED_SUFFIX if shared else "")
