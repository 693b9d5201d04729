"""The pooling runner's classifiers (`--convert classify`) against HF: tiny random `*ForSequenceClassification`
models made with save_pretrained, and a causal Qwen3 turned into a reranker by vLLM's --hf-overrides."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from flotilla.engine.config import ConfigError, EngineConfig
from flotilla.engine.errors import InvalidParamError
from flotilla.engine.llm import LLM

PROMPTS = [[1, 2, 3, 4, 5], [7] * 40, [11, 12], list(range(100, 133))]  # no pad id (0): HF pools the last token
QWEN3_RERANKER = {"architectures": ["Qwen3ForSequenceClassification"], "classifier_from_token": ["no", "yes"],
                  "is_original_qwen3_reranker": True}


def hf_logits(model_dir: Path, prompts: list[list[int]]) -> torch.Tensor:
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():  # one at a time: no padding in the oracle
        return torch.stack([model(torch.tensor([ids])).logits[0] for ids in prompts])


@pytest.fixture(scope="module")
def classifiers(tiny_classifier_dirs) -> dict[str, Path]:
    return tiny_classifier_dirs


@pytest.mark.parametrize("arch", ["qwen3", "qwen2", "llama"])
def test_classify_equals_hf_softmax_or_sigmoid_of_the_logits(classifiers, arch):
    llm = LLM(str(classifiers[arch]), max_model_len=64, max_num_batched_tokens=64, device="cpu")
    assert (llm.engine.config.model.runner, llm.engine.config.model.convert) == ("pooling", "classify")
    blocks = llm.engine.block_manager
    free_before = blocks.num_free_blocks
    logits = hf_logits(classifiers[arch], PROMPTS)
    expected = torch.sigmoid(logits) if logits.shape[1] == 1 else torch.softmax(logits, dim=-1)
    out = llm.classify(PROMPTS)
    torch.testing.assert_close(torch.tensor([o.probs for o in out]), expected, atol=1e-4, rtol=1e-4)
    raw = llm.classify(PROMPTS, use_activation=False)
    torch.testing.assert_close(torch.tensor([o.probs for o in raw]), logits, atol=1e-4, rtol=1e-4)
    assert [o.num_prompt_tokens for o in out] == [len(p) for p in PROMPTS]
    assert blocks.num_free_blocks == free_before
    with pytest.raises(InvalidParamError, match="classifier"):
        llm.embed(PROMPTS[:1])


def test_qwen3_reranker_overrides_score_the_yes_minus_no_logit(tiny_model_dirs):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = tiny_model_dirs["qwen3"]
    llm = LLM(str(path), runner="pooling", hf_overrides=QWEN3_RERANKER, max_model_len=64, device="cpu")
    assert llm.engine.config.model.convert == "classify"
    tokenizer = AutoTokenizer.from_pretrained(path)
    no, yes = tokenizer.convert_tokens_to_ids(["no", "yes"])
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        last = torch.stack([model(torch.tensor([ids])).logits[0, -1] for ids in PROMPTS])
    margin = last[:, yes] - last[:, no]
    out = llm.classify(PROMPTS, use_activation=False)
    torch.testing.assert_close(torch.tensor([o.probs for o in out]), margin[:, None], atol=1e-4, rtol=1e-4)
    probs = llm.classify(PROMPTS)
    torch.testing.assert_close(torch.tensor([o.probs for o in probs]), torch.sigmoid(margin)[:, None], atol=1e-4,
                               rtol=1e-4)


def test_a_tied_causal_lm_takes_the_head_from_the_embedding_rows(tiny_model_dirs):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = tiny_model_dirs["llama3-rope-tied"]
    overrides = {"classifier_from_token": ["no", "yes", "the"], "method": "no_post_processing"}
    llm = LLM(str(path), runner="pooling", convert="classify", hf_overrides=overrides, max_model_len=64,
              device="cpu")
    ids = AutoTokenizer.from_pretrained(path).convert_tokens_to_ids(overrides["classifier_from_token"])
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        last = torch.stack([model(torch.tensor([p])).logits[0, -1] for p in PROMPTS])
    out = llm.classify(PROMPTS)
    torch.testing.assert_close(torch.tensor([o.probs for o in out]), torch.softmax(last[:, ids], dim=-1), atol=1e-4,
                               rtol=1e-4)


@pytest.mark.parametrize(("kwargs", "convert"), [
    ({}, "classify"),
    ({"runner": "pooling"}, "classify"),
    ({"task": "classify"}, "classify"),
    ({"task": "score"}, "classify"),
    ({"convert": "classify"}, "classify"),
])
def test_a_classifier_checkpoint_picks_the_pooling_runner_and_classify(classifiers, kwargs, convert):
    config = EngineConfig.from_kwargs(str(classifiers["qwen2"]), device="cpu", **kwargs)
    assert (config.model.runner, config.model.convert) == ("pooling", convert)


@pytest.mark.parametrize("kwargs", [
    {"runner": "generate"},
    {"task": "embed"},
    {"runner": "pooling", "convert": "embed"},
    {"task": "score", "convert": "embed"},
])
def test_a_classifier_checkpoint_refuses_other_runners(classifiers, kwargs):
    with pytest.raises(ConfigError, match="sequence classifier|asks for"):
        EngineConfig.from_kwargs(str(classifiers["qwen2"]), device="cpu", **kwargs)


@pytest.mark.parametrize(("overrides", "words"), [
    ({"classifier_from_token": ["no", "yes"]}, "needs a method"),
    ({"classifier_from_token": ["no"], "method": "from_2_way_softmax"}, "two tokens"),
    ({"classifier_from_token": "yes", "method": "no_post_processing"}, "must be a list of strings"),  # the kind first
    ({"method": "from_3_way"}, "is not one of"),
    ({"problem_type": "ranking"}, "problem_type"),
])
def test_bad_classifier_overrides_refuse_to_start(tiny_model_dirs, overrides, words):
    with pytest.raises(ConfigError, match=words):
        EngineConfig.from_kwargs(str(tiny_model_dirs["qwen3"]), device="cpu", runner="pooling", convert="classify",
                                 hf_overrides=overrides)


def test_a_causal_checkpoint_without_a_score_head_refuses_to_load(tiny_model_dirs):
    # vLLM would leave the head uninitialised; here the loader names what the checkpoint lacks
    with pytest.raises(ValueError, match="score.weight"):
        LLM(str(tiny_model_dirs["qwen3"]), runner="pooling", convert="classify", max_model_len=64, device="cpu")


def test_an_unknown_classifier_token_refuses_to_load(tiny_model_dirs):
    with pytest.raises(ValueError, match="not tokens of the vocabulary"):
        LLM(str(tiny_model_dirs["qwen3"]), runner="pooling", max_model_len=64, device="cpu",
            hf_overrides={**QWEN3_RERANKER, "classifier_from_token": ["no", "zzqqxxyy"]})


def test_id2label_names_the_labels(classifiers):
    from flotilla.engine.pooling.classifier_config import labels

    config = json.loads((classifiers["qwen3"] / "config.json").read_text())
    assert labels(config) == ["negative", "neutral", "positive"]
    assert labels({**config, **QWEN3_RERANKER}) == ["LABEL_0"]


@pytest.mark.parametrize("runner", ["auto", "pooling"])
def test_an_inference_service_runner_passes_a_classifier_through(classifiers, runner):
    # The operator renders spec.runner as --runner (it owns --convert and --task); the engine resolves --convert
    # auto from the architecture, so a *ForSequenceClassification model is served as a classifier.
    from flotilla.operator.engine_args import engine_args
    from flotilla.operator.spec import InferenceServiceSpec

    spec = InferenceServiceSpec.model_validate({"model": {"source": "pvc://models/m"}, "runner": runner})
    args = engine_args(spec, "x")
    assert "--convert" not in args and "--task" not in args
    config = EngineConfig.from_kwargs(str(classifiers["qwen2"]), device="cpu", runner=args[args.index("--runner") + 1])
    assert (config.model.runner, config.model.convert) == ("pooling", "classify")


ST_SIGMOID = "torch.nn.modules.activation.Sigmoid"


@pytest.mark.parametrize(("overrides", "labels_of", "expected"), [
    ({"sentence_transformers": {"activation_fn": "torch.nn.modules.linear.Identity"}}, 1, "identity"),
    ({"sbert_ce_default_activation_function": "torch.nn.modules.activation.Tanh"}, 1,
     "torch.nn.modules.activation.Tanh"),
    # the sentence-transformers 4 key first, as vLLM; a null there means the default, whatever the older key says
    ({"sentence_transformers": {"activation_fn": ST_SIGMOID},
      "sbert_ce_default_activation_function": "torch.nn.modules.linear.Identity"}, 1, "sigmoid"),
    ({"sentence_transformers": {"activation_fn": None},
      "sbert_ce_default_activation_function": "torch.nn.modules.linear.Identity"}, 1, "sigmoid"),
    ({"sentence_transformers": {"version": "4.1.0"},
      "sbert_ce_default_activation_function": "torch.nn.modules.linear.Identity"}, 1, "identity"),
    # Sigmoid and Softmax mean the default: the label count picks (vLLM's PoolerActivation.wraps)
    ({"sentence_transformers": {"activation_fn": ST_SIGMOID}}, 3, "softmax"),
    ({"sbert_ce_default_activation_function": "torch.nn.modules.activation.Softmax"}, 1, "sigmoid"),
    # a problem_type decides first, as transformers' loss
    ({"problem_type": "single_label_classification",
      "sentence_transformers": {"activation_fn": "torch.nn.modules.linear.Identity"}}, 3, "softmax"),
    ({"problem_type": "regression", "sentence_transformers": {"activation_fn": ST_SIGMOID}}, 1, "identity"),
])
def test_a_sentence_transformers_activation_is_read_as_vllm_reads_it(overrides, labels_of, expected):
    from flotilla.engine.pooling.classifier_config import activation, classifier_problem

    config = {"architectures": ["LlamaForSequenceClassification"], "num_labels": labels_of, **overrides}
    assert classifier_problem(config) is None
    assert activation(config) == expected


@pytest.mark.parametrize("name", ["torch.nn.modules.linear.Identity", "torch.nn.modules.activation.Tanh"])
def test_a_sentence_transformers_activation_applies_to_hfs_logits(classifiers, tmp_path, name):
    # One label (a cross-encoder): Identity gives the raw logit, Tanh is applied as it is; /score reports the same
    # value (it classifies each pair through this path).
    path = tmp_path / "st-cross-encoder"
    shutil.copytree(classifiers["llama"], path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "sentence_transformers": {"activation_fn": name}}))
    llm = LLM(str(path), max_model_len=64, device="cpu")
    logits = hf_logits(path, PROMPTS)
    expected = torch.tanh(logits) if name.endswith("Tanh") else logits
    torch.testing.assert_close(torch.tensor([o.probs for o in llm.classify(PROMPTS)]), expected, atol=1e-4,
                               rtol=1e-4)


@pytest.mark.parametrize(("name", "error", "words"), [
    ("os.system", ConfigError, "not a class of torch.nn.modules"),
    ("torch.nn.modules.activation.NoSuchActivation", ValueError, "not a torch module class"),
    ("torch.nn.modules.activation.F", ValueError, "not a torch module class"),  # a module there, not a class
    ("torch.nn.modules.linear.Linear", ValueError, "cannot be built without arguments"),
    ("torch.nn.modules.activation.PReLU", ValueError, "weights of its own"),  # untrained weights, never saved
])
def test_a_sentence_transformers_activation_outside_torch_modules_refuses(tiny_model_dirs, name, error, words):
    with pytest.raises(error, match=words):
        LLM(str(tiny_model_dirs["qwen3"]), runner="pooling", max_model_len=64, device="cpu",
            hf_overrides={**QWEN3_RERANKER, "sbert_ce_default_activation_function": name})


def test_a_sentence_transformers_dropout_scores_a_pair_the_same_every_time():
    from flotilla.engine.pooling.score_head import activate

    logits = torch.randn(4, 1)
    name = "torch.nn.modules.dropout.Dropout"  # in training mode it would zero half the scores at random
    torch.testing.assert_close(activate(logits, name), logits)


def hf_token_logits(model_dir: Path, prompts: list[list[int]]) -> list[torch.Tensor]:
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():  # the score head on every token's final hidden state (vLLM's token_classify)
        return [model.score(model.model(torch.tensor([ids])).last_hidden_state[0]) for ids in prompts]


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_token_classify_is_hfs_score_head_on_every_token(classifiers, arch):
    llm = LLM(str(classifiers[arch]), max_model_len=64, max_num_batched_tokens=64, device="cpu")
    blocks = llm.engine.block_manager
    free_before = blocks.num_free_blocks
    logits = hf_token_logits(classifiers[arch], PROMPTS)
    llm.classify(PROMPTS)  # their full blocks cached: token_classify must compute every token all the same
    out = llm.encode(PROMPTS + PROMPTS[:1], pooling_task="token_classify")  # a prompt repeated in one pass too
    for got, want, ids in zip(out, [*logits, logits[0]], PROMPTS + PROMPTS[:1], strict=True):
        expected = torch.sigmoid(want) if want.shape[1] == 1 else torch.softmax(want, dim=-1)
        torch.testing.assert_close(got.outputs.data, expected, atol=1e-4, rtol=1e-4)
        assert got.prompt_token_ids == ids and got.outputs.data.shape == (len(ids), want.shape[1])
    raw = llm.reward(PROMPTS[1:2], use_activation=False)
    torch.testing.assert_close(raw[0].outputs.data, logits[1], atol=1e-4, rtol=1e-4)
    [last] = llm.encode(PROMPTS[3], pooling_task="classify")  # the sequence task: the last token's row
    torch.testing.assert_close(last.outputs.data, out[3].outputs.data[-1], atol=1e-5, rtol=1e-5)
    assert blocks.num_free_blocks == free_before
    with pytest.raises(ValueError, match="pooling_task must be one of"):
        llm.encode(PROMPTS[:1])
    with pytest.raises(InvalidParamError, match="classifier"):
        llm.encode(PROMPTS[:1], pooling_task="embed")
