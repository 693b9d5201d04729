"""Run a bench script against another checkout's engine: /tmp/spec5-before/p/flotilla first (main dd50e1b)."""
import runpy
import sys

sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in type(f).__module__ and "editable" not in repr(f)]
sys.path.insert(0, "/tmp/spec5-before/p")
script = sys.argv[1]
sys.argv = sys.argv[1:]
sys.path.insert(0, script.rsplit("/", 1)[0])
runpy.run_path(script, run_name="__main__")
