#!/bin/bash
# Session 26, helper knobs26 (~3 min): the shared launch-knob parser (kernels/launch_knobs.py) and the LM head's knobs
# per card (dispatch.LM_HEAD_GEMV_MEASURED) on a GPU, where the card is a real CUDA device name:
#   card  (30 s) the card's name as the tables key it, and the knobs the LM head and each one-row table resolve for it
#         (every card gives DEFAULT's head knobs since session 26 call 3; the H100 its own one-row entries)
#   tests (150 s) the GPU-marked tests of the touched files (the LM head through `lm_head_linear` at Llama-3.1-8B's
#         head with the switch's knobs, the dispatch decisions) and the snapshot test of every string and launch
# From the repository root, carrying .whl:   OUT=... bash bench/results/knobs26-gpu.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-env.sh" 200
L=$OUT/knobs26.log; : > $L
nvidia-smi --query-gpu=name --format=csv,noheader >> $L 2>&1
run_stage card 30 "^CARD" python3 -c "
import torch
from flotilla.kernels import dispatch, triton_fp8_row_gemv as fp8, triton_gated_gemv as gated, triton_gemv
from flotilla.kernels.card_tables import device_card
card = device_card(torch.zeros(1, device='cuda'))
print('CARD name', card)
print('CARD lm_head', dispatch.lm_head_gemv_for(card))
print('CARD gemv o_proj', triton_gemv.one_row_knobs(1, 4096, 4096, card))
print('CARD gated', gated.one_row_knobs(1, card))
print('CARD fp8 o_proj', fp8.env_knobs(4096, 4096, card))
"
run_stage tests 150 "passed|failed|FAILED|ERROR" python3 -m pytest -q -rfE --tb=short -p no:cacheprovider \
  -c $R/pyproject.toml --rootdir=$R $R/tests/kernels/test_lm_head_gemv.py $R/tests/kernels/test_launch_knobs.py \
  $R/tests/kernels/test_card_tables.py $R/tests/kernels/test_dispatch.py
