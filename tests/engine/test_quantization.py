"""Quantized weights: greedy tokens equal HF transformers run on what the quantized model computes.

The oracle for a weight-only scheme (W4A16, W8A16, GPTQ, AWQ) is HF on the dequantized weights: the
engine multiplies by exactly those weights, so greedy tokens must be identical (fp32 tiny models). fp8
W8A8 also rounds each activation row to fp8 per token (or with a static scale), so its oracle is HF on
the dequantized weights with that same rounding applied to every linear layer's input (a forward
pre-hook): the engine's `(x8 @ w8^T) * sx * sw` and HF's `(x8 * sx) @ (w8 * sw)^T` differ only in fp32
rounding order, far below the tiny models' gaps between the top two logits, so again identical. fp8 is
not token-identical to the bf16/fp32 model itself, and nothing here claims it is.

fp8 runs W8A8 only for linear calls of more than `FP8_GEMV_MAX_ROWS` (16) rows; smaller ones, decode
steps, run W8A16 (no activation rounding; `kernels/dispatch.py` says why), on the CPU as on the GPU.
Here every prompt is prefilled in one step of more than 16 rows (5 + 30 tokens) and every decode step
has 2 rows, so the oracle rounds the activations of HF's prefill forward (all prompt tokens) and not
those of its decode forwards (one token): the same per-row scheme as the engine's.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch.overrides import TorchFunctionMode

from flotilla.engine.config import ConfigError, EngineConfig
from flotilla.engine.llm import LLM
from flotilla.engine.sampling_params import SamplingParams
from flotilla.kernels.fp8_linear import FP8_DTYPE, fp8_linear_ref, quantize_fp8_rows
from flotilla.kernels.packed_int_linear import pack_codes, unpack_codes

from .hf_reference import hf_greedy, model_greedy
from .quant_checkpoints import compressed_tensors_checkpoint, int4_checkpoint, with_kv_scales

PROMPTS = [[5, 6, 7, 8, 9], [11, 12, 13] * 10]
TOKENS = 8
GREEDY = SamplingParams(temperature=0.0, max_tokens=TOKENS, ignore_eos=True)


@pytest.fixture(scope="session")
def wide_llama(tmp_path_factory: pytest.TempPathFactory, embedded_model_dir: Path) -> Path:
    """A tiny random Llama wide enough for groups of 128 (hidden 128, MLP 256), fp32."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(embedded_model_dir)
    torch.manual_seed(7)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         tie_word_embeddings=False, initializer_range=0.1, bos_token_id=1, eos_token_id=2)
    path = tmp_path_factory.mktemp("wide-llama")
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def _engine_tokens(path: Path, **kwargs) -> list[list[int]]:
    llm = LLM(str(path), max_model_len=256, **kwargs)
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


def _fake_quant_fp8(static_scale: float | None):
    def hook(module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...] | None:
        x = args[0]
        if x.shape[-2] == 1:  # a decode forward: the engine's decode step is W8A16
            return None
        scale = (x.abs().amax(-1, keepdim=True) / 448).clamp(min=1e-12) if static_scale is None \
            else torch.tensor(static_scale)
        return ((x / scale).clamp(-448, 448).to(FP8_DTYPE).float() * scale,)

    return hook


def _hf_fp8_greedy(path: Path, static_scale: float | None = None, quantize_weights: bool = False) -> list[list[int]]:
    """HF greedy with every linear layer's input rounded to fp8 (and its weight too when asked)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and not name.endswith("lm_head"):
            module.register_forward_pre_hook(_fake_quant_fp8(static_scale))
            if quantize_weights:
                w8, scale = quantize_fp8_rows(module.weight.data)
                module.weight.data = w8.float() * scale
    return model_greedy(model, PROMPTS, TOKENS)


def test_prompts_prefill_above_and_decode_within_the_fp8_gemv_rows():
    """What the fp8 oracle's prefill/decode split rests on (module docstring)."""
    from flotilla.kernels.dispatch import FP8_GEMV_MAX_ROWS

    assert sum(map(len, PROMPTS)) > FP8_GEMV_MAX_ROWS >= len(PROMPTS)


@pytest.mark.parametrize("arch", ["llama", pytest.param("qwen2", marks=pytest.mark.slow)])  # qwen2: q/k/v biases
def test_fp8_at_load_matches_hf_with_the_same_rounding(tiny_model_dirs, arch):
    path = tiny_model_dirs[arch]
    assert _engine_tokens(path, quantization="fp8") == _hf_fp8_greedy(path, quantize_weights=True)


@pytest.mark.parametrize("preset", ["W4A16", "W4A16_ASYM", pytest.param("W8A16", marks=pytest.mark.slow)])
def test_compressed_tensors_weight_only_matches_hf_on_dequantized_weights(wide_llama, tmp_path, preset):
    """Checkpoints packed by the compressed-tensors library (group 128 for W4A16), detected from
    config.json without --quantization."""
    path = compressed_tensors_checkpoint(wide_llama, tmp_path / preset, preset)
    assert EngineConfig.from_kwargs(str(path)).model.quantization == "compressed-tensors"
    assert _engine_tokens(path) == hf_greedy(path / "dequantized", PROMPTS, TOKENS)


@pytest.mark.parametrize("preset,static_scale", [("FP8_DYNAMIC", None),
                                                  pytest.param("FP8", 0.05, marks=pytest.mark.slow)])
def test_compressed_tensors_fp8_matches_hf_with_the_same_rounding(wide_llama, tmp_path, preset, static_scale):
    path = compressed_tensors_checkpoint(wide_llama, tmp_path / preset, preset)
    assert _engine_tokens(path) == _hf_fp8_greedy(path / "dequantized", static_scale)


@pytest.mark.parametrize(("fmt", "bits"), [("gptq", 4), ("awq", 4), ("gptq", 8)])
def test_gptq_and_awq_match_hf_on_dequantized_weights(wide_llama, tmp_path, fmt, bits):
    path = int4_checkpoint(wide_llama, tmp_path / fmt, fmt, bits=bits)
    assert _engine_tokens(path, quantization=fmt) == hf_greedy(path / "dequantized", PROMPTS, TOKENS)


@pytest.mark.parametrize(("fmt", "group"), [("gptq", 32), ("compressed-tensors", 64)])
def test_activation_order_checkpoints_match_hf_on_dequantized_weights(wide_llama, tmp_path, fmt, group):
    """GPTQ desc_act: true and compressed-tensors actorder group: groups of inputs in a random order per input (q/k/v
    and gate/up share theirs), each input's group in g_idx. The engine sorts every layer's inputs by group at load
    and gathers the activations likewise (engine/quantization/packed_int.py): HF's greedy tokens on the dequantized
    weights, and no layer's order left as it was (a permutation kept on each, the fused int4 forms not taken)."""
    from flotilla.engine.quantization.packed_int import int4_weight

    path = int4_checkpoint(wide_llama, tmp_path / fmt, fmt, group, act_order=True)
    llm = LLM(str(path), max_model_len=256)
    tokens = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]
    assert tokens == hf_greedy(path / "dequantized", PROMPTS, TOKENS)
    layers = [m for m in llm.engine.runner.model.modules() if hasattr(m, "weight_packed")]
    assert len(layers) == 8  # qkv, o, gate_up, down of 2 layers
    assert all(m.weight_perm is not None and int4_weight(m) is None for m in layers)
    assert not any(hasattr(m, "weight_g_idx") for m in layers)  # the permutation in its place


def test_a_dense_draft_model_beside_a_gptq_target_is_loaded_dense(wide_llama, tmp_path):
    """The draft's checkpoint says how it is quantized, as vLLM's draft config: a dense draft beside a GPTQ target
    (a quantized large model with a small draft) is loaded dense; it was loaded as GPTQ and failed the start-up."""
    path = int4_checkpoint(wide_llama, tmp_path / "gptq", "gptq")
    llm = LLM(str(path), max_model_len=256, speculative_config={"model": str(wide_llama), "num_speculative_tokens": 2})
    tokens = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]
    assert tokens == _engine_tokens(path)  # speculation is exact: the target's own greedy tokens
    assert llm.engine.speculator is not None and llm.engine.speculator.counts.num_drafts > 0


def test_packers_write_the_published_bit_layouts_by_hand():
    """Hand-computed words. GPTQ packs 8 consecutive *inputs* of one output column into a word, lowest
    nibble first: codes 1..8 -> 0x87654321. AWQ packs 8 *outputs* of one input row in the order
    0, 2, 4, 6, 1, 3, 5, 7: codes 1..8 of columns 0..7 put 1, 3, 5, 7, 2, 4, 6, 8 in nibbles 0..7
    -> 0x86427531. compressed-tensors packs inputs of a row like GPTQ, offset from signed codes."""
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32

    from .quant_checkpoints import pack_awq, pack_gptq

    codes = torch.arange(1, 9, dtype=torch.int32)
    zeros, scales = torch.full((1, 1), 8, dtype=torch.int32), torch.ones(1, 1)
    gptq = pack_gptq(codes.reshape(8, 1).t().expand(8, 8).t().t().contiguous()[:1].expand(8, 8).contiguous(),
                     scales.expand(8, 1), zeros.expand(8, 1))
    assert gptq["qweight"][0, 0].item() == 0x87654321 - 2**32  # int32 bits
    awq = pack_awq(codes.reshape(8, 1).expand(8, 8).contiguous(), scales.expand(8, 1), zeros.expand(8, 1))
    assert awq["qweight"][0, 0].item() == 0x86427531 - 2**32
    assert pack_codes(codes.reshape(1, 8), 4).item() == 0x87654321 - 2**32
    signed = (codes - 8).to(torch.int8).reshape(1, 8)  # compressed-tensors' signed codes
    assert pack_to_int32(signed, 4).item() == pack_codes(codes.reshape(1, 8), 4).item()
    assert unpack_codes(torch.tensor([[0x87654321 - 2**32]], dtype=torch.int32), 4).tolist() == [list(range(1, 9))]


def test_fp8_reference_equals_dequantized_math():
    g = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(5, 64, generator=g), torch.randn(32, 64, generator=g), torch.randn(32, generator=g)
    w8, ws = quantize_fp8_rows(w)
    assert w8.dtype == FP8_DTYPE and ws.shape == (32, 1)
    # e4m3 keeps 3 mantissa bits: each weight within 2^-4 of its row's scale-relative value
    assert ((w8.float() * ws - w).abs() <= w.abs() * 2**-4 + ws * 2**-9).all()
    x8, xs = quantize_fp8_rows(x)
    expected = (x8.float() * xs) @ (w8.float() * ws).t() + b
    torch.testing.assert_close(fp8_linear_ref(x, w8, ws, b), expected, rtol=1e-5, atol=1e-5)


def test_unsupported_checkpoints_and_flags_are_refused(wide_llama, tmp_path):
    path = int4_checkpoint(wide_llama, tmp_path / "gptq", "gptq")
    config = (path / "config.json").read_text()
    (path / "config.json").write_text(config.replace('"desc_act": false', '"desc_act": true'))
    # activation order over tensor-parallel ranks (flotilla/quantization_config.py act_order_parallel_problem)
    with pytest.raises(ConfigError, match="activation-order checkpoints .* run with --tensor-parallel-size 1 only, "
                                          "not 2"):
        EngineConfig.from_kwargs(str(path), tensor_parallel_size=2)
    assert EngineConfig.from_kwargs(str(path), pipeline_parallel_size=2).model.quantization == "gptq"
    (path / "config.json").write_text(config)
    with pytest.raises(ConfigError, match="does not match the checkpoint"):
        EngineConfig.from_kwargs(str(path), quantization="fp8")
    with pytest.raises(ConfigError, match="not supported yet"):
        EngineConfig.from_kwargs(str(wide_llama), quantization="int8")
    # a checkpoint format named for a dense checkpoint: an AssertionError (a traceback at start-up, or under
    # python -O an AttributeError) where a ConfigError belongs
    for fmt in ("compressed-tensors", "gptq", "awq"):
        with pytest.raises(ConfigError, match=f"--quantization {fmt} reads a {fmt} checkpoint"):
            EngineConfig.from_kwargs(str(wide_llama), quantization=fmt)


def test_fp8_kv_cache_halves_block_bytes_and_keeps_greedy_tokens(tiny_model_dirs):
    """A block takes half the bytes. fp8 K/V (scale 1.0) round to 3 mantissa bits, which can flip a
    near-tie late in a continuation: asserted is that every first token equals HF fp32's and that the
    common prefixes cover at least 85 % of the tokens (measured: 15 of 16)."""
    path = tiny_model_dirs["llama"]
    llm = LLM(str(path), max_model_len=256, dtype="bfloat16", kv_cache_dtype="fp8")
    plain = LLM(str(path), max_model_len=256, dtype="bfloat16")
    runner, plain_runner = llm.engine.runner, plain.engine.runner
    assert runner.kv_cache.dtype == FP8_DTYPE
    assert 2 * runner.bytes_per_block == plain_runner.bytes_per_block
    ours, ref = _engine_tokens(path, kv_cache_dtype="fp8"), hf_greedy(path, PROMPTS, TOKENS)
    assert [o[0] for o in ours] == [r[0] for r in ref]
    prefixes = [next((i for i, (a, b) in enumerate(zip(o, r, strict=True)) if a != b), len(r))
                for o, r in zip(ours, ref, strict=True)]
    common = sum(prefixes)
    assert common >= 0.85 * TOKENS * len(PROMPTS)


def test_checkpoint_kv_scales_apply_to_an_fp8_cache_only(tiny_model_dirs, tmp_path):
    """`self_attn.k_scale` / `v_scale` (llm-compressor's names) and `k_proj.output_scale` (older
    compressed-tensors) land on the layer's attention; a bf16 cache ignores them, as vLLM does."""
    path = with_kv_scales(tiny_model_dirs["llama"], tmp_path / "with-kv-scales",
                          {"model.layers.0.self_attn.k_scale": torch.tensor(0.5),
                           "model.layers.0.self_attn.v_scale": torch.tensor(2.0),
                           "model.layers.1.self_attn.k_proj.output_scale": torch.tensor([0.25])})
    fp8 = LLM(str(path), max_model_len=256, kv_cache_dtype="fp8").engine.runner.attention_layers
    assert [(a.k_scale, a.v_scale) for a in fp8] == [(0.5, 2.0), (0.25, 1.0)]
    plain = LLM(str(path), max_model_len=256).engine.runner.attention_layers
    assert [(a.k_scale, a.v_scale) for a in plain] == [(1.0, 1.0), (1.0, 1.0)]


def test_a_gguf_converted_checkpoint_is_not_quantized(embedded_model_dir):
    """The embedded model's config.json keeps transformers' `quant_method: gguf` from its conversion;
    its safetensors are plain bf16, so no scheme applies (and fp8 at load may be asked for)."""
    assert EngineConfig.from_kwargs(str(embedded_model_dir)).model.quantization is None
    assert EngineConfig.from_kwargs(str(embedded_model_dir), quantization="fp8").model.quantization == "fp8"


LLM_COMPRESSOR_CONFIGS = Path(__file__).parent / "data"


@pytest.mark.parametrize("name,symmetric", [("llmcompressor-0.14-gptq-w4a16-g64.json", True),
                                            ("llmcompressor-0.14-gptq-w4a16-asym-g64.json", False)])
def test_llm_compressor_gptq_configs_resolve_to_int4_groups_of_64(name, symmetric):
    """The `quantization_config` llm-compressor 0.14's oneshot + GPTQModifier wrote for the GPTQ
    checkpoints of SmolLM2 measured in docs/quantization.md (verbatim, bench/gptq_checkpoint.py):
    detected as compressed-tensors W4A16, groups of 64, with or without zero points; act-order `static`
    (stored groups unchanged) runs in group order, `group` and `dynamic` (permuted groups, g_idx) in activation order
    (engine/quantization/packed_int.py), another actorder is refused."""
    import json

    from flotilla.engine.quantization import linear_method, resolve_quantization
    from flotilla.engine.quantization.packed_int import PackedIntMethod

    hf_config = {"quantization_config": json.loads((LLM_COMPRESSOR_CONFIGS / name).read_text())}
    assert resolve_quantization(None, hf_config) == "compressed-tensors"
    method = linear_method("compressed-tensors", hf_config)
    assert isinstance(method, PackedIntMethod)
    assert (method.bits, method.group_size, method.symmetric) == (4, 64, symmetric)
    weights = hf_config["quantization_config"]["config_groups"]["group_0"]["weights"]
    for actorder, permuted in [(None, False), ("static", False), ("weight", False), ("group", True),
                               ("dynamic", True), ("Group", True), (True, True), (False, False)]:
        weights["actorder"] = actorder
        method = linear_method("compressed-tensors", hf_config)
        assert isinstance(method, PackedIntMethod) and method.act_order is permuted, actorder
    weights["actorder"] = "columns"
    with pytest.raises(ValueError, match="actorder 'columns' is not one of static, weight, group, dynamic or null"):
        resolve_quantization(None, hf_config)


def test_llm_compressor_asym_g64_checkpoint_matches_hf_on_dequantized_weights(wide_llama, tmp_path):
    """A tiny checkpoint with llm-compressor's verbatim asymmetric group-64 config (int32 zero points
    packed along the outputs), its tensors packed by the compressed-tensors library: the engine's
    greedy tokens equal HF's on the library's decompressed weights."""
    import json

    path = compressed_tensors_checkpoint(wide_llama, tmp_path / "asym-g64", "W4A16_ASYM", group_size=64)
    config = json.loads((path / "config.json").read_text())
    config["quantization_config"] = json.loads(
        (LLM_COMPRESSOR_CONFIGS / "llmcompressor-0.14-gptq-w4a16-asym-g64.json").read_text())
    (path / "config.json").write_text(json.dumps(config))
    assert _engine_tokens(path) == hf_greedy(path / "dequantized", PROMPTS, TOKENS)


@pytest.mark.parametrize(("bits", "group"), [(4, 32), (8, -1)])
def test_rtn_matches_hf_on_the_rounded_weights(wide_llama, tmp_path, monkeypatch, bits, group):
    """`--quantization rtn` (vLLM's RTN_NUM_BITS / RTN_GROUP_SIZE): greedy tokens equal HF's on every
    linear layer's weight rounded by the same rule (groups lie within a row, so rounding q/k/v or
    gate/up apart equals rounding the merged weight)."""
    from transformers import AutoModelForCausalLM

    from flotilla.engine.quantization.rtn import rtn_quantize

    monkeypatch.setenv("RTN_NUM_BITS", str(bits))
    monkeypatch.setenv("RTN_GROUP_SIZE", str(group))
    model = AutoModelForCausalLM.from_pretrained(wide_llama, dtype=torch.float32)
    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.Linear) and name != "lm_head":
                codes, scales = rtn_quantize(module.weight, bits, None if group == -1 else group)
                scale = scales.repeat_interleave(module.weight.shape[1] // scales.shape[1], dim=1)
                module.weight.copy_((codes.float() - 2 ** (bits - 1)) * scale)
    model.save_pretrained(tmp_path)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / f).write_bytes((wide_llama / f).read_bytes())
    ours = _engine_tokens(wide_llama, quantization="rtn")
    assert ours == hf_greedy(tmp_path, PROMPTS, TOKENS)
    assert ours != _engine_tokens(wide_llama)  # the rounding is there: 4- or 8-bit codes change the tokens


def test_rtn_settings_are_checked(wide_llama, monkeypatch):
    monkeypatch.setenv("RTN_NUM_BITS", "3")
    with pytest.raises((ConfigError, ValueError), match="RTN_NUM_BITS"):
        EngineConfig.from_kwargs(str(wide_llama), quantization="rtn")
    monkeypatch.setenv("RTN_NUM_BITS", "4")
    monkeypatch.setenv("RTN_GROUP_SIZE", "96")  # does not divide the 128 inputs of q/k/v
    with pytest.raises(ValueError, match="RTN_GROUP_SIZE=96"):
        LLM(str(wide_llama), max_model_len=256, quantization="rtn")


@pytest.mark.parametrize("bits", [4, 8])
def test_rtn_keeps_every_tensor_on_the_weights_device(bits):
    """RTN quantizes after loading, outside the model's device context: the packed codes, scales and zero points
    stay where the loaded weight was (a CPU zero point beside CUDA codes failed the int4 kernels on the H200).
    The meta device stands in for CUDA here: anything created without the weight's device lands on the CPU."""
    from flotilla.engine.quantization.rtn import RtnMethod

    layer = torch.nn.Module()
    layer.weight = torch.nn.Parameter(torch.randn(64, 128, device="meta"))
    RtnMethod(bits, 32).process_weights(layer)
    tensors = dict(layer.named_parameters()) | dict(layer.named_buffers())
    assert set(tensors) == {"weight_packed", "weight_scale", "weight_zero_point"}
    assert {t.device.type for t in tensors.values()} == {"meta"}


class _CudaScalarDivision(TorchFunctionMode):
    """CUDA's division by a scalar on the CPU: PyTorch's CUDA kernel computes `t / c` for a Python number (or a 0-dim
    CPU tensor) `c` as `t * fl(1 / c)`, the reciprocal rounded to the operation's compute dtype (fp32 for fp32, bf16
    and fp16 tensors); the CPU divides exactly."""

    _DIVS = (torch.Tensor.div, torch.Tensor.__truediv__, torch.Tensor.true_divide, torch.div, torch.true_divide)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in self._DIVS and not kwargs.get("rounding_mode") and len(args) == 2 and args[0].is_floating_point():
            t, c = args
            if isinstance(c, (int, float)) or (isinstance(c, torch.Tensor) and c.dim() == 0):
                compute = torch.float64 if t.dtype == torch.float64 else torch.float32
                return (t.to(compute) * torch.tensor(1.0 / float(c), dtype=compute)).to(t.dtype)
        return func(*args, **kwargs)


@pytest.mark.parametrize(("bits", "group"), [(4, 32), (8, None)])
def test_rtn_rounds_alike_on_every_device(bits, group):
    """rtn's codes and scales do not depend on how the device divides by a Python number. Each group's largest weight
    sits on a rounding tie (+-7.5 steps for 4 bits, +-127.5 for 8), so its code follows the scale's last bit: with the
    scale computed as `max|w| * 2 / 15`, CUDA (`_CudaScalarDivision`) and the CPU gave a third of the groups of the tiny
    Llama another extreme code, and the CUDA and CPU engines ran different models (test_cuda_lora_on_rtn4_layers
    [float32] failed on a 0.011 log-prob gap, session 20)."""
    from flotilla.engine.quantization.rtn import rtn_quantize

    weight = torch.randn(256, 128, generator=torch.Generator().manual_seed(0)) * 0.02  # HF's init of the tiny models
    twice_max = weight.abs().reshape(256, -1, group or 128).amax(-1) * 2.0
    with _CudaScalarDivision():
        emulated = rtn_quantize(weight, bits, group)
        old_scale = twice_max / (2**bits - 1)  # the old scale, as CUDA computed it
    assert not torch.equal(old_scale, twice_max / (2**bits - 1))  # the emulation rounds otherwise than the CPU
    exact = rtn_quantize(weight, bits, group)
    assert torch.equal(emulated[1], exact[1]) and torch.equal(emulated[0], exact[0])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize(("bits", "group"), [(4, 32), (8, None)])
def test_cuda_rtn_rounds_as_the_cpu(bits, group):
    """On a GPU: rtn's codes and scales of a CUDA weight equal those of the same weight on the CPU, bit for bit."""
    from flotilla.engine.quantization.rtn import rtn_quantize

    weight = torch.randn(1024, 512, generator=torch.Generator().manual_seed(0)) * 0.02
    cpu, cuda = rtn_quantize(weight, bits, group), rtn_quantize(weight.cuda(), bits, group)
    assert torch.equal(cuda[0].cpu(), cpu[0]) and torch.equal(cuda[1].cpu(), cpu[1])


@pytest.mark.parametrize("preset", ["W4A16", "FP8_DYNAMIC"])
def test_a_quantized_checkpoint_that_disagrees_with_config_json_is_refused(wide_llama, tmp_path, preset):
    """The loaders' size check skipped quantized layers: with config.json's intermediate_size 128 and the
    checkpoint's 256, gate/up loaded the first 128 rows of their packed codes (fp8 weights) and down_proj the
    first half of each row, and the model ran as garbage. HF refuses a mis-sized tensor ("size mismatch")."""
    path = compressed_tensors_checkpoint(wide_llama, tmp_path / preset, preset, dequantized_copy=False)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(config | {"intermediate_size": 128}))
    with pytest.raises(ValueError, match=r"mlp\.(gate|up|down)_proj\.weight"):
        LLM(str(path), max_model_len=256)


def test_block_scaled_fp8_configs_resolve_to_the_block_method():
    """llm-compressor's FP8_BLOCK (weights strategy `block`, `[out / 128, in / 128]` scales) loaded its scales as
    per-row ones, and vLLM's own fp8 format with `weight_block_size` (Qwen3-*-FP8) failed on `weight_scale_inv` "has
    no place"; both were then refused by name. They run now, W8A16 in blocks (tests/engine/test_fp8_block.py)."""
    from compressed_tensors.quantization import QuantizationConfig, preset_name_to_scheme

    from flotilla.engine.quantization import linear_method, resolve_quantization
    from flotilla.engine.quantization.fp8_block import Fp8BlockMethod

    scheme = preset_name_to_scheme("FP8_BLOCK", ["Linear"])
    qcfg = QuantizationConfig(config_groups={"group_0": scheme}, format="float-quantized", ignore=["lm_head"])
    fp8 = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 64]}
    for config in ({"quantization_config": qcfg.model_dump(exclude_none=True)}, {"quantization_config": fp8}):
        method = linear_method(resolve_quantization(None, config), config)
        assert isinstance(method, Fp8BlockMethod) and method.block == tuple(config["quantization_config"].get(
            "weight_block_size", [128, 128]))
    assert resolve_quantization(None, {"quantization_config": {"quant_method": "fp8"}}) == "fp8"


@pytest.mark.parametrize(("ignore", "runs"), [
    (["lm_head"], True), (["re:.*lm_head"], True),
    (["re:.*lm_head$"], True),  # a regular expression (`re:`) that names the head only
    (["lm_head", "re:.*mlp.gate$"], True),  # a mixture-of-experts router: no such layer in a dense decoder
    (["lm_head", "model.layers.0.mlp.down_proj"], False),  # a decoder linear left in bf16: not run
    (["re:.*layers.3.*"], False),
])
def test_compressed_tensors_ignore_entries_are_matched_as_compressed_tensors_does(ignore, runs):
    """`ignore` entries were taken as names ending in `lm_head`: a regular expression naming the head
    (`re:.*lm_head$`) or a router that a dense model lacks (`re:.*mlp.gate$`) refused checkpoints vLLM runs."""
    from flotilla.engine.quantization import resolve_quantization

    qcfg = json.loads((LLM_COMPRESSOR_CONFIGS / "llmcompressor-0.14-gptq-w4a16-g64.json").read_text())
    qcfg["ignore"] = ignore
    if runs:
        assert resolve_quantization(None, {"quantization_config": qcfg}) == "compressed-tensors"
    else:
        with pytest.raises(ValueError, match="ignored layers"):
            resolve_quantization(None, {"quantization_config": qcfg})


def test_an_fp8_checkpoint_with_unquantized_decoder_layers_is_refused_by_name():
    """vLLM's fp8 format may keep layers in bf16 (`ignored_layers`): their bf16 weights were cast into the fp8
    parameters unscaled, and the load then failed on a missing `weight_scale`, naming neither the cause nor the
    layer list. Refused at start-up now; an ignored LM head is fine (it is never quantized)."""
    from flotilla.engine.quantization import resolve_quantization

    fp8 = {"quant_method": "fp8", "activation_scheme": "dynamic", "ignored_layers": ["lm_head"]}
    assert resolve_quantization(None, {"quantization_config": fp8}) == "fp8"
    fp8["ignored_layers"] = ["lm_head", "model.layers.1.mlp.down_proj"]
    with pytest.raises(ValueError, match=r"ignored_layers \['model.layers.1.mlp.down_proj'\]"):
        resolve_quantization(None, {"quantization_config": fp8})


def test_checkpoint_kv_scales_of_another_pipeline_stage_are_skipped(tiny_model_dirs, monkeypatch):
    """A pipeline stage holds some decoder layers only (the others are placeholders); the loader skips the other
    layers' tensors, but KV scales were placed before that check: a checkpoint with `self_attn.k_scale` for every
    layer failed to start with pipeline parallelism ("the model has no such attention layer")."""
    from flotilla.engine.model_loader import _checkpoint_tensors, load_state
    from flotilla.engine.models import llama
    from flotilla.engine.models.registry import build_model

    path = tiny_model_dirs["llama"]
    monkeypatch.setattr(llama, "stage_layers", lambda n: range(0, 1))  # the first of two stages: layer 0
    model = build_model(json.loads((path / "config.json").read_text()))
    scales = [("model.layers.0.self_attn.k_scale", torch.tensor(0.5)),
              ("model.layers.1.self_attn.k_scale", torch.tensor(0.25))]
    load_state(model, [*_checkpoint_tensors(path), *scales])
    assert model.layers[0].self_attn.attn.k_scale == 0.5


def test_a_gptq_checkpoint_with_a_quantized_lm_head_is_refused_by_name():
    """GPTQModel may quantize the LM head (`lm_head: true`, lm_head.qweight): the load failed on
    "checkpoint tensor lm_head.weight_packed has no place", after building the whole model."""
    from flotilla.engine.quantization import resolve_quantization

    qcfg = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True}
    assert resolve_quantization(None, {"quantization_config": qcfg}) == "gptq"
    with pytest.raises(ValueError, match="lm_head: true"):
        resolve_quantization(None, {"quantization_config": qcfg | {"lm_head": True}})
