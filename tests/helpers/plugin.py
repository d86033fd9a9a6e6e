"""How an inner pytest run loads cuda_debug's plugin."""


def _entry_point_installed() -> bool:
    try:
        from importlib import metadata
        eps = metadata.entry_points()
        group = eps.select(group="pytest11") if hasattr(eps, "select") else eps.get("pytest11", [])
        return any(ep.value == "cuda_debug.pytest_plugin" for ep in group)
    except Exception:
        return False


INSTALLED = _entry_point_installed()
# Without `pip install -e .` the entry point is missing: load the plugin by name.
PLUGIN_ARGS = () if INSTALLED else ("-p", "cuda_debug.pytest_plugin")
