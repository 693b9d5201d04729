"""`vllm serve` flags vLLM itself removed (--max-seq-len-to-capture, --guided-decoding-*): a usage error that says
so and names what takes their place, not argparse's bare "unrecognized arguments" (flotilla/removed_flags.py)."""

from __future__ import annotations

import pytest

from flotilla.engine.arg_parser import ENGINE_COMPONENTS, flag_values
from flotilla.engine.server.cli import build_parser


@pytest.mark.parametrize(("argv", "message"), [
    (("--max-seq-len-to-capture", "8192"),
     "--max-seq-len-to-capture is not a flag of today's vLLM: vLLM removed it with its V0 engine (PR 25543, release "
     "0.11); here, too, there is no length above which a step falls back to eager"),
    (("--guided-decoding-backend", "xgrammar"),
     "--guided-decoding-backend is not a flag of today's vLLM: vLLM removed the --guided-decoding-* flags (its PR "
     "22772, release 0.10.2) for --structured-outputs-config; give --structured-outputs-config.backend VALUE"),
    (("--guided_decoding_backend=outlines",), "--guided-decoding-backend is not a flag of today's vLLM"),
    (("--max_seq_len_to_capture", "8192"), "--max-seq-len-to-capture is not a flag of today's vLLM"),
    (("--guided-decoding_disable-fallback",), "--guided-decoding-disable-fallback is not a flag of today's vLLM"),
    (("--guided-decoding-disable-any-whitespace",),
     "--guided-decoding-disable-any-whitespace is not a flag of today's vLLM: vLLM removed the --guided-decoding-* "
     "flags (its PR 22772, release 0.10.2) for --structured-outputs-config; give "
     "--structured-outputs-config.disable_any_whitespace VALUE"),
])
def test_a_flag_vllm_removed_is_refused_saying_so(capsys, argv, message):
    with pytest.raises(SystemExit) as refused:
        build_parser().parse_args(argv)
    assert refused.value.code == 2
    assert f"flotilla serve: error: {message}" in capsys.readouterr().err


def test_the_named_replacement_is_taken():
    args = build_parser().parse_args(["--structured-outputs-config.backend", "xgrammar"])
    assert flag_values(args, ENGINE_COMPONENTS) == {"structured_outputs_config": {"backend": "xgrammar"}}
