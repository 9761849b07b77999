"""Stand-in of python/sglang/srt/plugins/__init__.py at sgl-project/sglang
0298b5b4 (read_file id 60655478290): load_plugins() loads, once per process,
every entry point of the group "sglang.srt.plugins" (SGLANG_PLUGINS, when
set, a comma-separated allow-list of names) and calls each with no
arguments; SGLang's scheduler process does this before it builds the tree
cache. (HookRegistry.apply_hooks() follows there; no hooks in the
stand-in.)"""
import importlib.metadata
import os

GROUP = "sglang.srt.plugins"
_loaded = False


def load_plugins(entry_points=None):
    """entry_points: stand-in only, the entry points to load instead of the
    installed ones."""
    global _loaded  # pylint: disable=global-statement
    if _loaded and entry_points is None:
        return
    _loaded = True
    if entry_points is None:
        entry_points = importlib.metadata.entry_points(group=GROUP)
    allowed = os.environ.get("SGLANG_PLUGINS")
    names = set(allowed.split(",")) if allowed else None
    for ep in entry_points:
        if names is None or ep.name in names:
            ep.load()()
