"""The OpenAPI document of v2proxy's REST API, served at ``GET /openapi.json``."""

from __future__ import annotations

import functools
from importlib import resources
from typing import Any

import yaml

from v2proxy.codecs.json import dumps

RESOURCE = "openapi.yaml"


@functools.cache
def document() -> dict[str, Any]:
    """The OpenAPI document as a dict (parsed once)."""
    text = resources.files("v2proxy").joinpath(RESOURCE).read_text(encoding="utf-8")
    doc = yaml.safe_load(text)
    if not isinstance(doc, dict) or "openapi" not in doc:
        raise RuntimeError(f"v2proxy/{RESOURCE} is no OpenAPI document")
    return doc


@functools.cache
def document_json() -> bytes:
    """The document as compact JSON bytes (encoded once)."""
    return bytes(dumps(document()))
