"""Flotilla: Kubernetes-native LLM serving.

Subpackages: `flotilla.engine` (the inference engine), `flotilla.kernels` (Triton kernels and their
PyTorch references), `flotilla.operator` (the kopf operator). `flotilla.flags` is the engine's
command-line contract, shared by the engine and the operator.
"""

__version__ = "0.1.0"
