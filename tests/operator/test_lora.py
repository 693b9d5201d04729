"""spec.lora: the LoRA flags, adapter volumes mounted like the model, admission rules, the fit check."""

from __future__ import annotations

from flotilla.operator.admission import review
from flotilla.operator.deployment import build_deployment
from flotilla.operator.engine_args import engine_args
from flotilla.operator.fit import check_fit, lora_slot_bytes
from flotilla.operator.spec import InferenceServiceSpec

LLAMA_8B = {"hiddenSize": 4096, "numHiddenLayers": 32, "numAttentionHeads": 32, "numKeyValueHeads": 8,
            "intermediateSize": 14336, "vocabSize": 128256, "maxPositionEmbeddings": 131072}
ADAPTERS = [{"name": "sql", "source": "pvc://adapters/sql-lora"}, {"name": "chat", "source": "hf://org/chat-lora"}]


def make(lora: dict | None = None, **extra) -> dict:
    spec = {"model": {"source": "pvc://models/llama", "servedName": "llama", "config": LLAMA_8B},
            "resources": {"gpuProduct": "NVIDIA-H200"}, "scheduling": {"maxModelLen": 8192}, **extra}
    if lora is not None:
        spec["lora"] = lora
    return spec


def test_lora_renders_the_engine_flags():
    spec = InferenceServiceSpec.model_validate(make({"adapters": ADAPTERS, "maxLoras": 8, "maxLoraRank": 32}))
    args = engine_args(spec, "x")
    assert "--enable-lora" in args
    i = args.index("--lora-modules")
    assert args[i + 1 : i + 3] == ["sql=/adapters/sql", "chat=/adapters/chat"]
    assert args[args.index("--max-loras") + 1] == "8" and args[args.index("--max-lora-rank") + 1] == "32"
    assert "--max-cpu-loras" not in args


def test_without_lora_no_lora_flag_departs_from_the_engine_default():
    args = engine_args(InferenceServiceSpec.model_validate(make()), "x")
    assert "--enable-lora" not in args and "--lora-modules" not in args
    assert args[args.index("--max-loras") + 1] == "1" and args[args.index("--max-lora-rank") + 1] == "16"


def test_adapters_are_mounted_like_the_model():
    spec = InferenceServiceSpec.model_validate(make({"adapters": ADAPTERS}))
    pod = build_deployment(spec, "x", "ns")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["lora-sql"]["persistentVolumeClaim"] == {"claimName": "adapters", "readOnly": True}
    assert "emptyDir" in volumes["lora-chat"]
    mounts = {m["mountPath"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["/adapters/sql"] == {"name": "lora-sql", "mountPath": "/adapters/sql", "readOnly": True,
                                      "subPath": "sql-lora"}
    assert mounts["/adapters/chat"]["readOnly"] is True
    download = next(c for c in pod["initContainers"] if c["name"] == "download-lora-chat")
    assert "org/chat-lora" in download["command"]


def test_admission_refuses_duplicate_and_base_model_names():
    dup = review(make({"adapters": [ADAPTERS[0], {**ADAPTERS[1], "name": "sql"}]}), "x")
    assert any("sql is given twice" in e for e in dup.errors)
    base = review(make({"adapters": [{**ADAPTERS[0], "name": "llama"}]}), "x")
    assert any("base model's served name" in e for e in base.errors)
    cpu = review(make({"adapters": ADAPTERS, "maxLoras": 4, "maxCpuLoras": 2}), "x")
    assert any("maxCpuLoras" in e for e in cpu.errors)
    assert review(make({"adapters": ADAPTERS, "maxLoras": 2}), "x").errors == []


def test_fit_check_adds_the_adapter_slots():
    """Llama-3.1-8B, 8 slots of rank 16 in bf16: per layer and unit of rank, inputs 3h + q + 2h + i and
    outputs q + 2kv + h + 2i + h = 81,920 elements; x 32 layers x 128 x 2 bytes = 640 MiB."""
    plain = InferenceServiceSpec.model_validate(make())
    lora = InferenceServiceSpec.model_validate(make({"adapters": ADAPTERS, "maxLoras": 8, "maxLoraRank": 16}))
    assert lora_slot_bytes(lora.model.config, lora) == 81_920 * 32 * 8 * 16 * 2 == 640 * 2**20
    assert check_fit(lora).weight_bytes - check_fit(plain).weight_bytes == 640 * 2**20


def test_lora_with_parallelism_is_refused_until_supported():
    refused = review(make({"adapters": ADAPTERS}, parallelism={"tensor": 2},
                          resources={"gpuProduct": "NVIDIA-H200", "gpusPerReplica": 2}), "x")
    assert any("spec.lora: LoRA with tensor or pipeline parallelism" in e for e in refused.errors)
