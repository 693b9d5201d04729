"""admission.review: the rules the webhook and the reconciler share (no cluster)."""

from __future__ import annotations

from flotilla.operator.admission import review

BASE = {"model": {"source": "pvc://m"}}


def test_a_valid_spec_has_no_errors():
    assert review(BASE, "x").errors == []


def test_every_error_is_reported_not_only_the_first():
    result = review({**BASE, "dtype": "float32", "kvCache": {"dtype": "fp8"}, "engineArgs": ["--nope"]}, "x")
    assert len(result.errors) == 3
    assert result.message == "; ".join(result.errors)


def test_unparsable_spec_names_the_field():
    assert review({**BASE, "replicas": "two"}, "x").errors == [
        "spec.replicas: Input should be a valid integer, unable to parse string as an integer"]


def test_low_concurrency_is_a_warning_not_an_error():
    spec = {**BASE, "resources": {"gpuProduct": "NVIDIA-L4"}, "scheduling": {"maxModelLen": 4096, "maxNumSeqs": 256},
            "model": {"source": "pvc://m", "config": {
                "hiddenSize": 4096, "numHiddenLayers": 36, "numAttentionHeads": 32, "numKeyValueHeads": 8,
                "headDim": 128, "intermediateSize": 12288, "vocabSize": 151936}}}
    result = review(spec, "x")
    assert result.errors == [] and result.warnings[0].startswith("fit check: only ")
