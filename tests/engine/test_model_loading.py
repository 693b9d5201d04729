"""Model loading and config reading against HF transformers: checkpoints laid out as the Hub lays them out,
and config.json fields a claimed architecture allows."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from flotilla.engine.llm import LLM
from flotilla.engine.sampling_params import SamplingParams

from .hf_reference import hf_greedy

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
PROMPT = [5, 17, 230, 4000, 12, 9]


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _greedy(path: Path, **kwargs) -> list[int]:
    llm = LLM(str(path), max_model_len=128, **kwargs)
    return llm.generate(PROMPT, GREEDY, use_tqdm=False)[0].outputs[0].token_ids


def test_index_json_names_the_shards_to_load(tiny_model_dirs, tmp_path):
    # Mistral's Hub repos hold the HF shards (listed in model.safetensors.index.json) beside
    # consolidated.safetensors, the same weights under mistral-inference's names. HF and vLLM load only the
    # files the index lists; loading every *.safetensors file met names with no place in the model.
    path = _copy(tiny_model_dirs["mistral"], tmp_path / "mistral")
    assert (path / "model.safetensors.index.json").is_file()
    save_file({"tok_embeddings.weight": torch.zeros(4, 64), "layers.0.attention.wq.weight": torch.zeros(64, 64)},
              str(path / "consolidated.safetensors"))
    assert _greedy(path) == hf_greedy(path, [PROMPT], 8)[0]


def _variant(tiny_model_dirs, tmp_path: Path, arch: str, seed: int = 7, **changes) -> Path:
    """A fresh tiny random model of `arch` with config fields changed, saved as HF saves it."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    src = tiny_model_dirs[arch]
    config = AutoConfig.from_pretrained(src)
    for key, value in changes.items():
        setattr(config, key, value)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    path = tmp_path / f"{arch}-variant"
    model.save_pretrained(path)
    AutoTokenizer.from_pretrained(src).save_pretrained(path)
    return path


def test_an_activation_other_than_silu_is_refused(tiny_model_dirs, tmp_path):
    # LlamaConfig allows any `hidden_act`; the decoder computes SiLU only. vLLM refuses the others
    # ("Unsupported activation"); running them as SiLU generated other tokens than HF.
    path = _variant(tiny_model_dirs, tmp_path, "llama", hidden_act="gelu")
    assert json.loads((path / "config.json").read_text())["hidden_act"] == "gelu"
    with pytest.raises(ValueError, match="hidden_act"):
        _greedy(path)


YARN = {
    # Qwen2.5/Qwen3's long-context recipe, written the transformers-4 way (`rope_scaling`, `type`)
    "qwen2-rope-scaling": ("qwen2", {"rope_scaling": {"type": "yarn", "factor": 4.0,
                                                      "original_max_position_embeddings": 32}}),
    # transformers 5's `rope_parameters`, an explicit attention factor and betas, no truncation
    "qwen3-rope-parameters": ("qwen3", {"rope_parameters": {
        "rope_type": "yarn", "rope_theta": 1000.0, "factor": 8.0, "original_max_position_embeddings": 64,
        "attention_factor": 1.3, "beta_fast": 16, "beta_slow": 2, "truncate": False}}),
    # DeepSeek-style mscale / mscale_all_dim, original length defaulting to max_position_embeddings
    "llama-mscale": ("llama", {"rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 16.0,
                                                   "mscale": 0.8, "mscale_all_dim": 0.5}}),
}


@pytest.mark.parametrize("case", list(YARN))
def test_yarn_rope_matches_hf(tiny_model_dirs, tmp_path, case):
    # Qwen2/Qwen3 (and Llama) configs may ask for YaRN; it was refused ("rope scaling type 'yarn' is not supported").
    arch, fields = YARN[case]
    path = tmp_path / "yarn"
    base = _variant(tiny_model_dirs, tmp_path, arch)
    shutil.copytree(base, path)
    config = json.loads((path / "config.json").read_text())
    config.pop("rope_parameters", None) if "rope_scaling" in fields else None
    (path / "config.json").write_text(json.dumps(config | fields))
    assert _greedy(path) == hf_greedy(path, [PROMPT], 8)[0]


def test_yarn_extends_the_context_to_original_times_factor(tiny_model_dirs, tmp_path):
    # vLLM's limit for a YaRN model is original_max_position_embeddings * factor: Qwen's recipe (32768 x 4 for
    # 131072 tokens) keeps max_position_embeddings at 32768. Flotilla refused any length past it.
    path = _variant(tiny_model_dirs, tmp_path, "qwen2")
    config = json.loads((path / "config.json").read_text())
    rope = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 512}
    (path / "config.json").write_text(json.dumps(config | {"rope_parameters": rope}))
    llm = LLM(str(path), max_num_batched_tokens=2048, max_num_seqs=2)
    assert llm.engine.config.model.max_model_len == 2048
    prompt = [(7 * i) % 40000 + 3 for i in range(700)]  # positions past max_position_embeddings (512)
    out = llm.generate(prompt, GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    assert out == hf_greedy(path, [prompt], 8)[0]


@pytest.mark.parametrize("dropped", ["model.layers.1.mlp.up_proj.weight", "model.layers.0.self_attn.k_proj.weight",
                                     "model.norm.weight"])
def test_a_checkpoint_missing_a_tensor_is_refused_by_its_name(tiny_model_dirs, tmp_path, dropped):
    # q/k/v and gate/up load into one merged parameter each: a checkpoint lacking one of them left its slice of
    # the merged weight uninitialised (torch.empty) and loaded without a word.
    path = _copy(tiny_model_dirs["llama"], tmp_path / "llama")
    index = json.loads((path / "model.safetensors.index.json").read_text())
    shard = path / index["weight_map"].pop(dropped)
    tensors = load_file(str(shard))
    del tensors[dropped]
    save_file(tensors, str(shard), metadata={"format": "pt"})
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match=dropped.removeprefix("model.").replace(".", r"\.")):
        _greedy(path)


@pytest.mark.parametrize(("field", "value", "tensor"), [
    ("vocab_size", 49000, "model.embed_tokens.weight"),  # fewer rows than the checkpoint's 49152
    ("intermediate_size", 96, r"mlp.(gate|up|down)_proj.weight"),  # gate/up: 128 rows; down: 128 columns
    ("num_key_value_heads", 4, "self_attn.k_proj.weight"),  # 2 KV heads in the checkpoint
])
def test_a_checkpoint_that_disagrees_with_config_json_is_refused(tiny_model_dirs, tmp_path, field, value, tensor):
    # The loaders copy a narrowed slice of each checkpoint tensor: a tensor larger than config.json says loaded its
    # first rows without a word (vocab_size, intermediate_size), a smaller one failed with torch's "start (0) +
    # length (64) exceeds dimension size (32)", naming nothing. HF refuses both ("size mismatch for ...").
    path = _copy(tiny_model_dirs["llama"], tmp_path / "llama")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(config | {field: value}))
    with pytest.raises(ValueError, match=tensor.replace(".", r"\.")):
        _greedy(path)


def test_a_qwen3_config_without_head_dim_takes_transformers_default(tiny_model_dirs, tmp_path):
    # Qwen3Config's head_dim defaults to 128 (not hidden_size / num_attention_heads, Llama's rule), and HF and vLLM
    # read the config through that class: a config.json that leaves head_dim out means 128. Flotilla took 64 / 4.
    path = _variant(tiny_model_dirs, tmp_path, "qwen3", head_dim=128)
    config = json.loads((path / "config.json").read_text())
    del config["head_dim"]
    (path / "config.json").write_text(json.dumps(config))
    assert _greedy(path) == hf_greedy(path, [PROMPT], 8)[0]


def test_a_mistral_config_without_sliding_window_slides_at_4096(tiny_model_dirs, tmp_path):
    # MistralConfig's sliding_window defaults to 4096, and HF and vLLM read the config through that class: past
    # 4096 tokens they attend to the window only. Flotilla saw no window and served full attention up to
    # max_position_embeddings, other tokens than HF's past 4096.
    from transformers import AutoConfig

    path = _copy(tiny_model_dirs["mistral"], tmp_path / "mistral")
    config = json.loads((path / "config.json").read_text())
    del config["sliding_window"]
    (path / "config.json").write_text(json.dumps(config | {"max_position_embeddings": 8192}))
    assert AutoConfig.from_pretrained(path).sliding_window == 4096
    from flotilla.engine.config import EngineConfig

    assert EngineConfig.from_kwargs(str(path)).model.max_model_len == 4096


def test_a_tied_model_with_another_lm_head_in_its_checkpoint_warns(tiny_model_dirs, tmp_path, caplog):
    # tie_word_embeddings=true, yet the checkpoint holds an lm_head.weight other than the embedding (a fine-tune that
    # trained the head apart): vLLM skips the tensor and runs the tied head; transformers 5 unties and runs the
    # checkpoint's. Flotilla keeps vLLM's tokens, and now says (as transformers does) that the tensor is ignored;
    # it said nothing.
    import logging

    src = tiny_model_dirs["llama3-rope-tied"]
    path = _copy(src, tmp_path / "tied")
    index = json.loads((path / "model.safetensors.index.json").read_text())
    shard = path / index["weight_map"]["model.embed_tokens.weight"]
    tensors = load_file(str(shard))
    tensors["lm_head.weight"] = torch.randn_like(tensors["model.embed_tokens.weight"])
    save_file(tensors, str(shard), metadata={"format": "pt"})
    index["weight_map"]["lm_head.weight"] = shard.name
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    with caplog.at_level(logging.WARNING, logger="flotilla.engine.model_loader"):
        ours = _greedy(path)
    assert any("lm_head.weight differs" in r.getMessage() for r in caplog.records)
    assert ours == hf_greedy(src, [PROMPT], 8)[0]  # vLLM's: the embedding as the head
    assert ours != hf_greedy(path, [PROMPT], 8)[0]  # transformers 5 runs the checkpoint's head
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="flotilla.engine.model_loader"):
        _greedy(src)  # the usual tied checkpoint: no lm_head.weight, no warning
    assert not any("lm_head.weight" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("arch", ["llama", "llama3-rope-tied", "qwen3"])
def test_a_pipeline_stage_loads_only_what_it_runs(tiny_model_dirs, monkeypatch, arch):
    # As vLLM: the first stage holds the embedding, the last the final norm and the LM head (tied: the embedding
    # too, as its head's weight), each its own layers; a real checkpoint loads into every stage with the other
    # stages' tensors skipped and nothing missing.
    from flotilla.engine import parallel_state
    from flotilla.engine.config import EngineConfig
    from flotilla.engine.model_loader import load_model

    path = tiny_model_dirs[arch]
    tied = json.loads((path / "config.json").read_text())["tie_word_embeddings"]
    config = EngineConfig.from_kwargs(str(path), max_model_len=128, pipeline_parallel_size=2)
    reference = load_model(config.model, torch.device("cpu"))  # one stage (the default rank): the whole model
    full = dict(reference.named_parameters())
    for rank, (expected_tops, layer) in enumerate([({"embed_tokens", "layers"}, 0),
                                                    ({"layers", "norm"} | ({"embed_tokens"} if tied else
                                                                           {"lm_head"}), 1)]):
        monkeypatch.setattr(parallel_state, "_RANK", parallel_state.ParallelRank.of(rank, 1, 2))
        model = load_model(config.model, torch.device("cpu"))
        params = dict(model.named_parameters())
        assert {n.split(".")[0] for n in params} == expected_tops
        assert {int(n.split(".")[1]) for n in params if n.startswith("layers.")} == {layer}
        assert all(torch.equal(p, full[n]) for n, p in params.items())  # loaded: the one-stage model's values
        if rank == 1:
            head = model.lm_head.weight
            assert head is model.embed_tokens.weight if tied else torch.equal(head, full["lm_head.weight"])
            hidden = torch.randn(3, head.shape[1])
            assert torch.equal(model.compute_logits(hidden), reference.compute_logits(hidden))
        else:
            with pytest.raises(RuntimeError, match="only the last holds the LM head"):
                model.compute_logits(torch.zeros(1, 64))
