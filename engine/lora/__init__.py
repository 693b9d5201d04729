"""Multi-LoRA serving: many PEFT adapters on one base model, batched together in one step.

- `request.py`: `LoRARequest`, which adapter a request runs with (vLLM's name, id and path).
- `adapter.py`: reads a PEFT adapter directory into per-projection A/B matrices.
- `layers.py`: `LoRALinear`, the wrapper put around a model's projections after loading.
- `slots.py`: the per-step token -> adapter-slot mapping the wrappers read.
- `manager.py`: device slots (LRU) with a CPU cache of adapters behind them.
- `registry.py`: the served adapter names of a front end (`--lora-modules`, runtime load/unload).
"""
