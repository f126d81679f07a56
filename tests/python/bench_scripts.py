"""The bench/ scripts the tests import by path (bench/ is no package)."""
import importlib.util
import os

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "bench")


def load(name):
    """bench/<name>.py as a fresh module (its own imports of model.py resolve beside it)."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", os.path.join(BENCH, f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
