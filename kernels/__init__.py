"""Flotilla's kernels: Triton kernels for the GPU, each beside the pure-PyTorch reference that runs on
the CPU and serves as its test oracle. The engine calls them only through `flotilla.kernels.dispatch`,
the one place where CPU and GPU paths differ.

This package imports nothing of Flotilla's.
"""
