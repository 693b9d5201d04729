"""Activation-order layouts (GPTQ desc_act: true, compressed-tensors actorder group) on one layer, by hand.

A layer of 16 inputs in 2 groups of 8 whose groups alternate: input i is in group i % 2 (its g_idx). Both formats
store the codes in input order (here code i for input i in every output row); the engine sorts the inputs by group
at load (engine/quantization/packed_int.py), so each row's words become the even inputs' codes then the odd ones',
and it gathers the activation's columns in that order. The greedy-token oracle over whole models is
tests/engine/test_quantization.py `test_activation_order_checkpoints_match_hf_on_dequantized_weights`.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from flotilla.engine.layers.linear import ColumnParallelLinear, MergedColumnParallelLinear
from flotilla.engine.quantization import compressed_tensors, gptq
from flotilla.engine.quantization.packed_int import int4_weight

from .quant_checkpoints import pack_compressed_tensors, pack_gptq

IN, OUT, GROUP = 16, 8, 8
CODES = torch.arange(IN, dtype=torch.int32).expand(OUT, IN).contiguous()  # code i for input i
ALTERNATING = torch.arange(IN, dtype=torch.int32) % 2
IN_ORDER = torch.arange(IN, dtype=torch.int32) // GROUP
SCALES = torch.tensor([1.0, 0.5]).expand(OUT, 2).contiguous()
ZEROS = torch.tensor([8, 4], dtype=torch.int32).expand(OUT, 2).contiguous()
GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": GROUP, "desc_act": True, "sym": False}
CT = {"quant_method": "compressed-tensors", "format": "pack-quantized", "ignore": ["lm_head"],
      "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": None, "weights": {
          "num_bits": 4, "type": "int", "strategy": "group", "group_size": GROUP, "symmetric": False,
          "actorder": "group"}}}}
FORMATS = {"gptq": (gptq, GPTQ), "compressed-tensors": (compressed_tensors, CT)}


def _word(value: int) -> int:
    """A 32-bit word as int32 holds it."""
    return value - 2**32 if value >= 2**31 else value


def _checkpoint(fmt: str, g_idx: torch.Tensor) -> dict[str, torch.Tensor]:
    if fmt == "gptq":
        return pack_gptq(CODES, SCALES, ZEROS, 4, g_idx)
    return pack_compressed_tensors(CODES, SCALES, ZEROS, g_idx)


def _load(layer: Any, fmt: str, tensors: dict[str, torch.Tensor], shard_id: Any = None) -> None:
    """Put one part's checkpoint tensors into `layer` as the model loader does: converted, then each by its
    parameter's own loader or the layer's."""
    module, qcfg = FORMATS[fmt]
    for name, tensor in module.convert_tensors(((f"p.{k}", v) for k, v in tensors.items()), qcfg):
        param = getattr(layer, name.rpartition(".")[2])
        loader = getattr(param, "weight_loader", None) or layer.weight_loader
        loader(param, tensor.to(param.dtype), shard_id)


def _layer(fmt: str, g_idx: torch.Tensor) -> ColumnParallelLinear:
    module, qcfg = FORMATS[fmt]
    layer = ColumnParallelLinear(IN, OUT)
    layer.quant_method = module.linear_method(qcfg)
    layer.quant_method.create_weights(layer)
    _load(layer, fmt, _checkpoint(fmt, g_idx))
    with torch.no_grad():
        layer.quant_method.process_weights(layer)
    return layer


def _dequantized(g_idx: torch.Tensor) -> torch.Tensor:
    return (CODES.float() - ZEROS[:, g_idx.long()].float()) * SCALES[:, g_idx.long()]


def test_the_packers_write_the_activation_order_layouts_by_hand():
    """Both formats keep the codes in input order whatever g_idx says: inputs 0..7 in word 0 (0x76543210), 8..15 in
    word 1 (0xFEDCBA98); GPTQ along the inputs of a column, compressed-tensors of a row. Zero points pack along the
    outputs: compressed-tensors' eight 8s of group 0 as 0x88888888 (GPTQ v1: zero - 1, 0x77777777)."""
    words = [_word(0x76543210), _word(0xFEDCBA98)]
    gptq_tensors = _checkpoint("gptq", ALTERNATING)
    assert gptq_tensors["qweight"][:, 0].tolist() == words and gptq_tensors["g_idx"].tolist() == ALTERNATING.tolist()
    assert gptq_tensors["qzeros"][:, 0].tolist() == [0x77777777, 0x33333333]
    ct_tensors = _checkpoint("compressed-tensors", ALTERNATING)
    assert ct_tensors["weight_packed"][0].tolist() == words
    assert ct_tensors["weight_zero_point"][0].tolist() == [_word(0x88888888), 0x44444444]


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_inputs_are_sorted_by_group_at_load_and_the_activation_gathered(fmt):
    """Each row's words after the load: the even inputs' codes 0, 2, .., 14 (0xECA86420), then the odd ones' 1, 3,
    .., 15 (0xFDB97531); the permutation the even inputs then the odd ones; the product that of the dequantized
    weight `(code - zero[g_idx]) * scale[g_idx]` with the input as it came."""
    layer = _layer(fmt, ALTERNATING)
    assert layer.weight_packed[:, 0].tolist() == [_word(0xECA86420)] * OUT
    assert layer.weight_packed[:, 1].tolist() == [_word(0xFDB97531)] * OUT
    assert layer.weight_perm.tolist() == [*range(0, IN, 2), *range(1, IN, 2)]
    assert layer.weight_perm.dtype == torch.int32 and not hasattr(layer, "weight_g_idx")
    assert int4_weight(layer) is None  # the fused one-row forms do not gather
    x = torch.randn(3, IN, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(layer(x), x @ _dequantized(ALTERNATING).t())


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_a_g_idx_in_group_order_keeps_no_permutation(fmt):
    """desc_act: true (or actorder group) with g_idx `i // group`: today's layout, nothing gathered, the fused int4
    forms still taken."""
    layer = _layer(fmt, IN_ORDER)
    assert layer.weight_perm is None and not hasattr(layer, "weight_g_idx")
    assert layer.weight_packed[:, 0].tolist() == [_word(0x76543210)] * OUT
    assert int4_weight(layer) is not None
    x = torch.randn(3, IN, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(layer(x), x @ _dequantized(IN_ORDER).t())


def test_the_parts_of_a_merged_layer_must_give_one_g_idx():
    """gate and up (as q/k/v) read one input: one permutation serves both, so their g_idx must agree (vLLM requires
    it too); a part with another one is refused by name."""
    module, qcfg = FORMATS["gptq"]
    layer = MergedColumnParallelLinear(IN, [OUT, OUT])
    layer.quant_method = module.linear_method(qcfg)
    layer.quant_method.create_weights(layer)
    _load(layer, "gptq", _checkpoint("gptq", ALTERNATING), 0)
    _load(layer, "gptq", _checkpoint("gptq", ALTERNATING), 1)  # the same: loads
    other = torch.cat([ALTERNATING[1:], ALTERNATING[:1]])  # a valid g_idx, another order
    with pytest.raises(ValueError, match="g_idx of part 1 differs from that of another part of the merged layer"):
        _load(layer, "gptq", _checkpoint("gptq", other), 1)


def test_a_g_idx_that_does_not_make_whole_groups_is_refused():
    with pytest.raises(ValueError, match="g_idx does not put 8 inputs in each of 2 groups"):
        _layer("gptq", torch.zeros(IN, dtype=torch.int32))


DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 8, 64, 300])
def test_a_random_activation_order_layer_equals_its_dequantized_weight_on_the_device(monkeypatch, rows):
    """A random g_idx on 512 inputs in groups of 128, sorted where the model lives (CUDA when there is one, bf16:
    the sort on the device and the Triton int4 kernels by row count, the one-row wide GEMV, the GEMV, the GEMM, the
    dequantize + cuBLAS; the CPU's kernels here), a few output rows at a time (3 chunks, the last one short): the
    product equals that of the dequantized weight with the input as it came."""
    from flotilla.engine.quantization import packed_int

    from .quant_checkpoints import act_order_codes

    monkeypatch.setattr(packed_int, "_SORT_ROWS", 40)
    generator = torch.Generator().manual_seed(3)
    weight = torch.randn(96, 512, generator=generator) * 0.05
    codes, scales, zeros, g_idx = act_order_codes(weight, torch.randperm(512, generator=generator), 128)
    dtype = torch.bfloat16 if DEVICE.type == "cuda" else torch.float32
    qcfg = {**GPTQ, "group_size": 128}
    with torch.device(DEVICE):
        layer = ColumnParallelLinear(512, 96).to(dtype)  # create_weights gives the scales the weight's dtype
        layer.quant_method = gptq.linear_method(qcfg)
        layer.quant_method.create_weights(layer)
    for name, tensor in gptq.convert_tensors(((f"p.{k}", v) for k, v in pack_gptq(codes, scales, zeros, 4, g_idx)
                                              .items()), qcfg):
        param = getattr(layer, name.rpartition(".")[2])
        (getattr(param, "weight_loader", None) or layer.weight_loader)(param, tensor.to(param.dtype), None)
    with torch.no_grad():
        layer.quant_method.process_weights(layer)
    assert layer.weight_perm is not None and layer.weight_packed.device.type == DEVICE.type
    dequantized = (codes.float() - zeros[:, g_idx.long()].float()) * scales.half().float()[:, g_idx.long()]
    x = torch.randn(rows, 512, generator=generator)
    got = layer(x.to(DEVICE, dtype)).float().cpu()
    want = x.to(dtype).float() @ dequantized.t()
    tolerance = 2e-2 if dtype == torch.bfloat16 else 1e-4
    torch.testing.assert_close(got, want, rtol=tolerance, atol=tolerance * want.abs().max().item())


def test_the_cpu_decode_plan_does_not_take_an_activation_order_layer():
    """The CPU one-row decode step (engine/models/llama_cpu_decode.py) multiplies by the layer's CPU int4 weight
    itself: an activation-order layer's codes are sorted by group, and that product without the input's gather is
    another weight's, so the plan leaves such a layer to the module path (which gathers); bf16, groups of 128, where
    torch's CPU int4 kernel takes the weight."""
    from flotilla.engine.models import llama_cpu_decode

    from .quant_checkpoints import act_order_codes

    generator = torch.Generator().manual_seed(4)
    weight = torch.randn(96, 512, generator=generator) * 0.05
    codes, scales, zeros, g_idx = act_order_codes(weight, torch.randperm(512, generator=generator), 128)
    qcfg = {**GPTQ, "group_size": 128}
    layer = ColumnParallelLinear(512, 96).to(torch.bfloat16)
    layer.quant_method = gptq.linear_method(qcfg)
    layer.quant_method.create_weights(layer)
    for name, tensor in gptq.convert_tensors(((f"p.{k}", v) for k, v in pack_gptq(codes, scales, zeros, 4, g_idx)
                                              .items()), qcfg):
        param = getattr(layer, name.rpartition(".")[2])
        (getattr(param, "weight_loader", None) or layer.weight_loader)(param, tensor.to(param.dtype), None)
    with torch.no_grad():
        layer.quant_method.process_weights(layer)
    assert layer.weight_perm is not None and layer.cpu_int_weight is not None
    x = torch.randn(1, 512, generator=generator).to(torch.bfloat16)
    assert not torch.allclose(llama_cpu_decode._matmul(layer, x).float(), layer(x).float(), atol=1e-2)  # no gather
    assert not llama_cpu_decode._linear_takes(layer, ColumnParallelLinear, torch.bfloat16)
