"""Will Linux start the engine with the command line and environment its pod gets? (execve's size limits)

The container runtime starts the engine with execve(2), which refuses (E2BIG, "argument list too long") a program
whose strings are too large; the pod then crash-loops before the engine logs a line. Two limits apply (fs/exec.c):

- MAX_ARG_STRLEN: each argument and each environment string ("NAME=value") is at most 128 KiB with its closing NUL;
- the total: the executable's path, every argument and environment string with their NULs, and an 8-byte pointer
  to each string must fit in a quarter of the stack limit (RLIMIT_STACK / 4, at most 6 MiB). Containers inherit the
  runtime's stack limit, 8 MiB by default, and a pod cannot change it: 2 MiB. (Measured here: /bin/true starts with
  exactly 2,097,152 such bytes under `ulimit -s 8192`, 4 MiB under 16384.)

What the engine gets is the pod's strings after the kubelet's `$(NAME)` expansion (kubelet_pods.go,
third_party/forked/golang/expansion): an env value is expanded with the variables listed before it, and the
arguments with the whole environment; `$$` is one `$`, and a reference to a name not defined stays as written. So
`B=$(A)$(A)` is twice A's size although the spec holds 12 bytes of it; sizes are counted after expansion. (The
operator doubles every '$' of the arguments, deployment.container_args, so they reach the engine as written.)

The spec does not show everything: the image's ENV, the runtime's PATH and HOSTNAME, the kubelet's KUBERNETES_*
variables of the API's Service (service links are off on engine pods, but these eight are always set), the
interpreter that the `flotilla` script's #! line adds, and the values of Secrets and ConfigMaps (valueFrom, envFrom),
which the operator does not read. The check counts what it knows as a lower bound (an unknown value as empty) and
keeps RESERVED_BYTES of the 2 MiB for the rest, so it refuses only a spec whose pod could not start.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from flotilla.operator.deployment import container_args, container_env
from flotilla.operator.engine_args import ENGINE_COMMAND, engine_args
from flotilla.operator.spec import InferenceServiceSpec

# Linux's MAX_ARG_STRLEN: execve refuses any one argument or environment string longer than this, its NUL included.
MAX_ARG_BYTES = 131_072
# A quarter of the default 8 MiB stack limit: the most argument and environment bytes (strings, NULs, pointers).
EXEC_BYTES = 2 << 20
POINTER_BYTES = 8
# Left for what the spec does not show (module docstring): an image's ENV is a few KiB even on CUDA base images.
RESERVED_BYTES = 64 << 10
# The variables of the API's Service that the kubelet sets whatever enableServiceLinks says (values unknown here).
KUBELET_NAMES = ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT", "KUBERNETES_SERVICE_PORT_HTTPS",
                 "KUBERNETES_PORT", "KUBERNETES_PORT_443_TCP", "KUBERNETES_PORT_443_TCP_PROTO",
                 "KUBERNETES_PORT_443_TCP_PORT", "KUBERNETES_PORT_443_TCP_ADDR")


def _bytes(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def expanded_bytes(text: str, sizes: Mapping[str, int | None], any_defined: bool = False) -> int:
    """UTF-8 bytes of `text` after the kubelet's $(NAME) expansion, where `sizes` gives a defined name's expanded
    bytes (None: defined with a value unknown here, counted as 0), and an undefined name stays as written unless
    `any_defined` (an envFrom source may define any name: counted as 0).

    Sizes, not strings: `B=$(A)$(A)`, `C=$(B)$(B)`, ... doubles at each step, and the operator must not build it."""
    raw = text.encode("utf-8", "surrogatepass")
    total, i = 0, 0
    while i < len(raw):
        if (dollar := raw.find(b"$", i)) == -1:  # the rest holds no reference: skipped at C speed, not byte by byte
            return total + len(raw) - i
        total, i = total + dollar - i, dollar
        if i + 1 == len(raw):
            total, i = total + 1, i + 1
        elif raw[i + 1] == ord("$"):  # an escaped operator: one '$'
            total, i = total + 1, i + 2
        elif raw[i + 1] == ord("(") and (close := raw.find(b")", i + 2)) != -1:
            name = raw[i + 2:close].decode("utf-8", "surrogatepass")
            if name in sizes or any_defined:
                total += sizes.get(name) or 0
            else:
                total += close + 1 - i
            i = close + 1
        else:  # '$' before anything else, or an unclosed '$(': kept as written
            total, i = total + 2, i + 2
    return total


@dataclass(frozen=True)
class ExecString:
    """One string of the engine's execve: where the spec sets it, and its bytes with the NUL once expanded."""

    where: str
    size: int
    expanded: bool  # whether the kubelet's expansion changed its size


def _env_strings(spec: InferenceServiceSpec) -> tuple[list[ExecString], dict[str, int | None]]:
    """The container's environment strings (the last of a name, as the kubelet keeps it), and the expanded size of
    every variable the kubelet expands with (None when unknown here: a Secret's or ConfigMap's, or the kubelet's)."""
    sizes: dict[str, int | None] = dict.fromkeys(KUBELET_NAMES)
    where: dict[str, tuple[str, bool]] = {}
    entries = container_env(spec)
    operator_entries = len(entries) - len(spec.pod.env)
    for i, entry in enumerate(entries):
        name, value = entry["name"], entry.get("value")
        at = f"spec.pod.env[{i - operator_entries}] ({name}=...)" if i >= operator_entries else f"the operator's {name}"
        # The kubelet expands a value with the variables before it (envFrom's keys come first).
        sizes[name] = None if value is None else expanded_bytes(value, sizes, bool(spec.pod.env_from))
        where[name] = (at, value is not None and sizes[name] != _bytes(value))
    strings = [ExecString(at, _bytes(name) + 1 + (sizes[name] or 0) + 1, expanded)
               for name, (at, expanded) in where.items()]
    return strings, sizes


def _arg_strings(spec: InferenceServiceSpec, name: str, sizes: Mapping[str, int | None]) -> list[ExecString]:
    # The container's args are the engine's with '$' doubled (deployment.container_args): expanded, the engine's.
    rendered, escaped = ENGINE_COMMAND + engine_args(spec, name), ENGINE_COMMAND + container_args(spec, name)
    first_extra = len(rendered) - len(spec.engine_args)
    strings = []
    for i, (arg, in_pod) in enumerate(zip(rendered, escaped, strict=True)):
        where = f"spec.engineArgs[{i - first_extra}]" if i >= first_extra else f"the value of {rendered[i - 1]}"
        size = expanded_bytes(in_pod, sizes, bool(spec.pod.env_from))
        strings.append(ExecString(where, size + 1, size != _bytes(arg)))
    return strings


def string_problem(s: ExecString, what: str) -> str | None:
    """Why `s`, one string of the engine's exec (`what`: argument or environment string), keeps the engine from
    starting; None when it fits MAX_ARG_BYTES."""
    if s.size <= MAX_ARG_BYTES:
        return None
    expanded = " once the kubelet replaces its $(...) references" if s.expanded else ""
    return (f"{s.where} is {s.size} bytes long with its closing NUL{expanded}; Linux starts a program only with "
            f"{what}s of at most {MAX_ARG_BYTES} bytes each (128 KiB, MAX_ARG_STRLEN), so the engine would never "
            "start: shorten it")


def _total_problem(args: list[ExecString], env: list[ExecString]) -> str | None:
    arg_bytes = sum(s.size + POINTER_BYTES for s in args)
    env_bytes = sum(s.size + POINTER_BYTES for s in env)
    if arg_bytes + env_bytes <= EXEC_BYTES - RESERVED_BYTES:
        return None
    return (f"the engine's arguments ({arg_bytes} bytes) and environment ({env_bytes} bytes), counted as Linux counts "
            f"them (each string, its NUL and an {POINTER_BYTES}-byte pointer) once the kubelet expands $(...), come "
            f"to {arg_bytes + env_bytes} bytes; Linux starts a program with at most {EXEC_BYTES} (a quarter of the "
            f"default 8 MiB stack limit, ARG_MAX), and {RESERVED_BYTES} of them are left for the image's and the "
            "kubelet's variables, so the engine would never start: shorten spec.engineArgs or spec.pod.env")


def argument_length_problems(spec: InferenceServiceSpec, name: str) -> list[str]:
    """Each argument of the engine's command line too long for Linux to start the engine with, named by its
    spec.engineArgs index or, for a rendered field, the flag before it."""
    _, sizes = _env_strings(spec)
    return [p for s in _arg_strings(spec, name, sizes) if (p := string_problem(s, "argument"))]


def exec_problems(spec: InferenceServiceSpec, name: str) -> list[str]:
    """Why Linux would refuse to start the engine of `spec`'s pods: an argument or environment string past
    MAX_ARG_BYTES, or all of them past EXEC_BYTES less RESERVED_BYTES (see the module docstring)."""
    env, sizes = _env_strings(spec)
    args = _arg_strings(spec, name, sizes)
    problems = [p for s in args if (p := string_problem(s, "argument"))]
    problems += [p for s in env if (p := string_problem(s, "environment string"))]
    if problems:  # one string past its own limit says enough; the total follows once it is shortened
        return problems
    total = _total_problem(args, env)
    return [total] if total else []
