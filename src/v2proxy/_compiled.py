"""Which form of the modules setup.py compiles with mypyc is imported: the compiled one, unless
``V2PROXY_PURE_PYTHON`` is set (not ``0``) or, in a source tree built in place, any of them is
older than its source (edited since the last build): then all of them are imported from source.
Never a mix: compiled modules call each other's native code directly, so one loaded from source
beside the others would be a second copy of its classes.

:func:`install` puts the finder first on ``sys.meta_path`` (``v2proxy/__init__.py`` calls it);
:data:`COMPILED` tells tests which form runs.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from importlib.abc import MetaPathFinder
from importlib.machinery import EXTENSION_SUFFIXES, ModuleSpec, PathFinder
from importlib.util import spec_from_file_location
from types import ModuleType

_HERE = os.path.dirname(os.path.abspath(__file__))


def _compiled_pairs() -> list[tuple[str, str]]:
    """(extension, source) of each compiled module built beside its source."""
    pairs = []
    for folder, _dirs, files in os.walk(_HERE):
        for name in files:
            for suffix in EXTENSION_SUFFIXES:
                if name.endswith(suffix):
                    source = os.path.join(folder, name[: -len(suffix)] + ".py")
                    if os.path.exists(source):
                        pairs.append((os.path.join(folder, name), source))
    return pairs


def _use_compiled(pairs: list[tuple[str, str]]) -> bool:
    if os.environ.get("V2PROXY_PURE_PYTHON", "") not in ("", "0"):
        return False
    if not os.path.exists(os.path.join(_HERE, "..", "..", "setup.py")):
        return True  # installed (a wheel): built from the sources beside it
    # a source tree, built in place: a source edited since is newer than its extension
    return all(os.path.getmtime(ext) >= os.path.getmtime(src) for ext, src in pairs)


class _FromSource(MetaPathFinder):
    """Finds each compiled module's source in place of its extension."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if not fullname.startswith("v2proxy.") or path is None:
            return None
        spec = PathFinder.find_spec(fullname, path)
        origin = None if spec is None else spec.origin
        source = None if origin is None else _SOURCES.get(os.path.abspath(origin))
        return None if source is None else spec_from_file_location(fullname, source)


_PAIRS = _compiled_pairs()
#: each compiled module's extension -> its source
_SOURCES = dict(_PAIRS)
#: whether the compiled modules are the ones imported
COMPILED = bool(_PAIRS) and _use_compiled(_PAIRS)


def install() -> None:
    """Imports compiled modules from source when they are not to be used (see the module)."""
    if _PAIRS and not COMPILED and not any(isinstance(f, _FromSource) for f in sys.meta_path):
        sys.meta_path.insert(0, _FromSource())
