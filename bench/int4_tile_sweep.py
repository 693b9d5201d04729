"""The wide int4 GEMV's tiles chosen INSIDE the engine: bench/tile_sweep.py with `--family int4` as the default (the
command line bench/results/tile20-gpu.sh runs; every option is tile_sweep.py's).

    python3 bench/int4_tile_sweep.py --model /tmp/llama8b-w4a16 --json tile-sweep.json [--budget-s 150]
    python3 bench/int4_tile_sweep.py --dry-run   # the descent on a made-up cost (no GPU): what it would try
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from tile_sweep import main

if __name__ == "__main__":
    main(family="int4")
