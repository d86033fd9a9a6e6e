"""Type checkers' view of the C core, cuda_debug._core (csrc/): thin functions that
return raw values (ints, tuples, bytes, NumPy arrays), which the Python modules name
(STYLE.md 1). Each name is Any here; what each returns is said where Python reads it.

PYTEST_DONT_REWRITE: pytest loads this package's plugin in every run (docs/pytest.md)."""
from typing import Any

def __getattr__(name: str) -> Any: ...
