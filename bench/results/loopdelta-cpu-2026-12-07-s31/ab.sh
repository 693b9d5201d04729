#!/bin/bash
# Alternate before/after runs of gil_stall.py: the server imports engine/server/sse.py at its start, so the file is
# swapped in only until the server logs "serving" (the engine core is ready by then), then the fix is put back.
cd /work/wt-srv31/bench
for i in 2 3; do
  for side in before after; do
    cp /tmp/srv31/sse_$side.py ../engine/server/sse.py
    OMP_NUM_THREADS=1 timeout 900 ../.venv/bin/python gil_stall.py --tokens 200 --rounds 2 --alone 5 \
      --json results/loopdelta-cpu-2026-12-07-s31/$side-$i.json > /tmp/srv31/$side-$i.out 2>&1 &
    pid=$!
    until grep -q "flotilla.serve: serving" /tmp/srv31/$side-$i.out; do sleep 1; done
    sleep 3
    cp /tmp/srv31/sse_after.py ../engine/server/sse.py
    wait $pid; echo "$side-$i rc=$?"
  done
done
