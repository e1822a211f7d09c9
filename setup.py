"""v2proxy's compiled parts, built on install (``pip install .`` or ``-e .``; a C compiler is
needed): the shared-memory guard (C) and the modules of the common request path compiled by
mypyc from their typed Python source (docs/performance.md, "The common path compiled").
Everything else about the package is in pyproject.toml.

``V2PROXY_PURE_PYTHON=1`` builds without mypyc: the same modules run as Python, slower.
"""

from __future__ import annotations

import os

from setuptools import Extension, setup

#: the modules every small relayed request runs through, compiled by mypyc. Left out:
#: backends/rest.py (tests replace RestBackend's methods, which a compiled class refuses),
#: core/relay.py (async generators), core/headers.py (a list subclass), codecs/json_shapes.py and
#: codecs/framed_check.py (their msgspec Structs take class keywords mypyc does not pass on),
#: backends/rest_requests.py (compiled, its constant header tuples are made anew per use, so the
#: client's head cache misses: floor.py 102.1k -> 114.4k), and the timer (0.3k: not worth it)
COMPILED = [
    "src/v2proxy/http/head.py",
    "src/v2proxy/http/request.py",
    "src/v2proxy/http/response.py",
    "src/v2proxy/http/server_conn.py",
    "src/v2proxy/http/client_conn.py",
    "src/v2proxy/http/client.py",
    "src/v2proxy/http/client_head.py",
    "src/v2proxy/frontends/rest_quick.py",
    "src/v2proxy/frontends/exchange.py",
    "src/v2proxy/frontends/rest_infer.py",
    "src/v2proxy/frontends/rest_record.py",
    "src/v2proxy/frontends/rest_answer.py",
    "src/v2proxy/backends/rest_relay.py",
    "src/v2proxy/backends/rest_requests.py",
    "src/v2proxy/backends/rest_answers.py",
    "src/v2proxy/backends/endpoints.py",
    "src/v2proxy/backends/rest_encoding.py",
    "src/v2proxy/codecs/json.py",
    "src/v2proxy/codecs/relay_check.py",
    "src/v2proxy/core/admission.py",
    "src/v2proxy/ops/recorders.py",
    "src/v2proxy/ops/metrics.py",
    "src/v2proxy/core/knowledge.py",
    "src/v2proxy/core/decide.py",
    "src/v2proxy/core/ports.py",
]

# memcpy that reports a SIGBUS instead of dying of it: every access to a client's shared memory
# goes through it (v2proxy/shm/guarded.py)
ext_modules = [
    Extension("v2proxy.shm._guard", ["src/v2proxy/shm/_guard.c"], extra_compile_args=["-O2"])
]
if os.environ.get("V2PROXY_PURE_PYTHON", "") in ("", "0"):
    from mypyc.build import mypycify

    # typed as the build sees them: pip's build environment lacks v2proxy's dependencies, whose
    # types are Any here, so not pyproject.toml's strict settings (`make typecheck` checks those)
    flags = ["--config-file", os.devnull, "--ignore-missing-imports", "--follow-imports=silent"]
    ext_modules += mypycify([*flags, *COMPILED], group_name="v2proxy", opt_level="3")

setup(ext_modules=ext_modules)
