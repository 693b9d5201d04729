"""Linux's execve limits on the engine's pod (operator/exec_size.py): sizes after the kubelet's $(NAME) expansion,
each string under 128 KiB, and all of them under 2 MiB less the reserve."""

from __future__ import annotations

import resource
import subprocess
import time

import pytest

from flotilla.operator.admission import review
from flotilla.operator.deployment import build_deployment, container_env
from flotilla.operator.engine_args import ENGINE_COMMAND
from flotilla.operator.exec_size import (
    EXEC_BYTES,
    MAX_ARG_BYTES,
    POINTER_BYTES,
    RESERVED_BYTES,
    exec_problems,
    expanded_bytes,
)
from flotilla.operator.spec import InferenceServiceSpec

SOURCE = {"model": {"source": "pvc://models/m"}}


def make(**spec) -> InferenceServiceSpec:
    return InferenceServiceSpec.model_validate({**SOURCE, **spec})


def env(*pairs: tuple[str, str]) -> dict:
    return {"pod": {"env": [{"name": n, "value": v} for n, v in pairs]}}


@pytest.mark.parametrize(("text", "size"), [
    ("$(A)", 5),  # a defined name: its value
    ("x$(A)y$(A)", 12),
    ("$$(A)", 4),  # '$$' is one '$': the reference is kept as written, less one '$'
    ("$(NOPE)", 7),  # an undefined name stays as written
    ("$(S)", 0),  # defined by a Secret: unknown, counted as nothing
    ("$x", 2), ("$", 1), ("a$(", 3), ("$(A", 3),  # no reference: as written
    ("é$(A)é", 9),  # UTF-8 bytes
])
def test_expansion_follows_the_kubelets_rules(text, size):
    assert expanded_bytes(text, {"A": 5, "S": None}) == size


# Inputs and what the kubelet makes of them, from Kubernetes' own expansion cases (third_party/forked/golang/expansion)
# with A, B, C one letter each, REF holding the text "$(A)" and EMPTY empty.
KUBERNETES_CASES = [
    ("$(A)-$(A)", "A-A"), ("$$(B)_$(A)", "$(B)_A"), ("f000-$$A", "f000-$A"), ("$(A$(B))", "$(A$(B))"),
    ("$(A$(B)", "$(A$(B)"), ("%%$(REF)--$(REF)%%", "%%$(A)--$(A)%%"), ("foo$(EMPTY)bar", "foobar"),
    ("foo$(Awhoops!", "foo$(Awhoops!"), ("$?_boo_$!", "$?_boo_$!"), ("$$$$$$(NOPE)", "$$$(NOPE)"),
    ("$$$$$$$(A)", "$$$A"), ("${A}", "${A}"), ("$(B)_______$(", "B_______$("), ("$(A)foobarzab$", "Afoobarzab$"),
    ("--$($($($($--", "--$($($($($--"), ("$(foo$$var)", "$(foo$$var)"),
]


@pytest.mark.parametrize(("text", "expanded"), KUBERNETES_CASES)
def test_expansion_sizes_match_kubernetes_own_cases(text, expanded):
    assert expanded_bytes(text, {"A": 1, "B": 1, "C": 1, "REF": 4, "EMPTY": 0}) == len(expanded)


def test_with_env_from_any_undefined_name_may_be_defined():
    # An envFrom source's keys are unknown: a reference to a name not listed may expand to anything (counted as 0).
    assert expanded_bytes("$(NOPE)", {}, any_defined=True) == 0


def test_a_value_that_expands_past_128_kib_is_refused_by_its_index():
    spec = make(**env(("A", "a" * 100_000), ("B", "$(A)$(A)")))
    assert exec_problems(spec, "m") == [
        "spec.pod.env[1] (B=...) is 200003 bytes long with its closing NUL once the kubelet replaces its $(...) "
        "references; Linux starts a program only with environment strings of at most 131072 bytes each (128 KiB, "
        "MAX_ARG_STRLEN), so the engine would never start: shorten it"]
    # Escaped, the same text is 12 bytes in the pod.
    assert exec_problems(make(**env(("A", "a" * 100_000), ("B", "$$(A)$$(A)"))), "m") == []


def test_an_argument_reaches_the_engine_as_written_whatever_its_dollars():
    # The operator doubles each '$' of the args (deployment.container_args), so the kubelet expands nothing there:
    # $(A) stays 4 bytes, and 131,000 '$' (262,000 in the pod spec) come back as 131,000.
    spec = make(engineArgs=["--chat-template", "{{ m }}$(A)$(A)"], **env(("A", "a" * 70_000)))
    assert exec_problems(spec, "m") == []
    assert exec_problems(make(engineArgs=["--chat-template", "{{ m }}" + "$" * 131_000]), "m") == []
    (problem,) = exec_problems(make(engineArgs=["--chat-template", "{{ m }}" + "$" * (MAX_ARG_BYTES - 7)]), "m")
    assert problem.startswith("spec.engineArgs[1] is 131073 bytes long with its closing NUL; Linux")


def test_a_doubling_chain_is_sized_without_being_built():
    # B=$(A)$(A), C=$(B)$(B), ...: 2**40 bytes in the pod, from a spec of a few hundred bytes.
    pairs = [("V0", "a")] + [(f"V{i}", f"$(V{i - 1})$(V{i - 1})") for i in range(1, 41)]
    start = time.process_time()
    problems = exec_problems(make(**env(*pairs)), "m")
    assert time.process_time() - start < 5  # (CPU time, not the clock; building the 2**40 bytes would never end)
    assert any(p.startswith(f"spec.pod.env[40] (V40=...) is {2 ** 40 + 5} bytes") for p in problems)


def _total(spec: InferenceServiceSpec) -> int:
    """The bytes Linux counts for the engine's execve of `spec`, from the built Deployment's strings (values of
    $(A) references expanded by hand here: the tests below use only literal values)."""
    container = build_deployment(spec, "m", "ns")["spec"]["template"]["spec"]["containers"][0]
    strings = container["command"] + container["args"]
    strings += [f"{e['name']}={e.get('value', '')}" for e in container["env"]]
    return sum(len(s.encode()) + 1 + POINTER_BYTES for s in strings)


def _bulk(total: int, spec: dict) -> InferenceServiceSpec:
    """`spec` with literal env values of 100 kB each bringing the execve bytes to exactly `total`."""
    base = _total(make(**spec))
    pairs, left = [], total - base
    while left > 0:
        name = f"BULK_{len(pairs)}"
        size = min(100_000, left - len(name) - 2 - POINTER_BYTES)
        pairs.append((name, "a" * size))
        left -= len(name) + 2 + POINTER_BYTES + size
    return make(**{**spec, "pod": {"env": [*spec.get("pod", {}).get("env", []),
                                           *({"name": n, "value": v} for n, v in pairs)]}})


def test_the_total_is_refused_past_two_mib_less_the_reserve_to_the_byte():
    limit = EXEC_BYTES - RESERVED_BYTES
    at = _bulk(limit, {})
    assert _total(at) == limit and exec_problems(at, "m") == []
    past = _bulk(limit + 1, {})
    assert _total(past) == limit + 1
    (problem,) = exec_problems(past, "m")
    assert f"come to {limit + 1} bytes; Linux starts a program with at most {EXEC_BYTES}" in problem
    assert problem.endswith("so the engine would never start: shorten spec.engineArgs or spec.pod.env")
    assert problem in review({**SOURCE, "pod": past.pod.model_dump(by_alias=True, exclude_none=True)}, "m").errors


def test_the_total_counts_expanded_references():
    # 20 references to a 100 kB value: 2 MB in the pod, 1.5 kB in the spec; each string well under 128 KiB.
    pairs = [("A", "a" * 100_000)] + [(f"R{i}", "$(A)") for i in range(20)]
    (problem,) = exec_problems(make(**env(*pairs)), "m")
    assert "environment (2100" in problem and "once the kubelet expands $(...)" in problem


def test_secret_values_count_their_names_only_and_a_reference_to_them_nothing():
    spec = make(pod={"env": [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
                             {"name": "B", "value": "$(TOKEN)" * 20_000}]})
    assert exec_problems(spec, "m") == []  # 160 kB as written, nothing known once expanded


def test_the_kernel_counts_as_the_module_says():
    """The rule the module applies, checked against this machine's kernel under an 8 MiB stack limit: strings with
    their NULs, the executable's path and a pointer each, up to exactly 2 MiB."""
    true = "/bin/true"
    hard = resource.getrlimit(resource.RLIMIT_STACK)[1]
    if hard != resource.RLIM_INFINITY and hard < 8 << 20:
        pytest.skip("the hard stack limit here is under 8 MiB")

    def starts(total: int) -> bool:
        args, left = [true], total - (len(true) + 1) * 2 - POINTER_BYTES
        while left > 0:
            size = min(100_000, left - 1 - POINTER_BYTES)
            args.append("a" * size)
            left -= size + 1 + POINTER_BYTES
        try:
            subprocess.run(args, env={}, check=True,
                           preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_STACK, (8 << 20, hard)))
        except OSError:
            return False
        return True

    assert MAX_ARG_BYTES == 128 << 10
    assert starts(EXEC_BYTES)
    assert not starts(EXEC_BYTES + 1)


def test_the_counted_strings_are_the_containers():
    # The module reads the Deployment builder's env (container_env) and command: the operator's variables come first.
    spec = make(**env(("A", "1")))
    assert [e["name"] for e in container_env(spec)][-1] == "A"
    assert build_deployment(spec, "m", "ns")["spec"]["template"]["spec"]["containers"][0]["command"] == ENGINE_COMMAND


def test_text_without_references_is_sized_at_c_speed():
    # Every review sizes each argument and value (a chat template of up to the 1.5 MiB etcd holds) on the webhook's
    # path: text with no '$' is skipped by bytes.find, not walked byte by byte in Python (0.19 s of CPU a MB). An
    # order, not a time: 2 MB without '$' cost less CPU than 200 kB of '$x' (14x less; 8x more when walked).
    def cpu(text: str) -> float:
        best = float("inf")
        for _ in range(3):
            start = time.process_time()
            expanded_bytes(text, {})
            best = min(best, time.process_time() - start)
        return best

    assert cpu("a" * 2_000_000) < cpu("$x" * 100_000)
