"""The backend's metadata answers parsed once into typed facts: what its server can do
(:class:`ServerCaps`, from ``GET /v2``), what a model looks like (:class:`ModelMeta`, from its
metadata) and the facts of its configuration the proxy uses (:class:`ConfigFacts`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: the servers whose name in ``GET /v2`` says more than their extensions list
_TRITON = "triton"
_MLSERVER = "mlserver"


@dataclass(frozen=True, slots=True)
class ServerCaps:
    """What the backend's server says it is and can do (its ``GET /v2``)."""

    name: str = ""
    version: str = ""
    #: the extensions listed, strings only, in their order
    extensions: tuple[str, ...] = ()
    binary_tensors: bool = False
    #: whether binary tensors it does not list may be tried (None: unknown; False: never)
    binary_unlisted: bool | None = None
    classification: bool = False
    generate: bool = False
    system_shared_memory: bool = False


def server_caps(meta: Mapping[str, Any]) -> ServerCaps:
    """The capabilities a server metadata answer (``GET /v2``, gRPC ServerMetadata) states."""
    name, version, ext = meta.get("name"), meta.get("version"), meta.get("extensions")
    extensions = tuple(e for e in ext if isinstance(e, str)) if isinstance(ext, list) else ()
    name = name if isinstance(name, str) else ""
    binary = "binary_tensor_data" in extensions
    return ServerCaps(
        name=name,
        version=version if isinstance(version, str) else "",
        extensions=extensions,
        binary_tensors=binary,
        binary_unlisted=True if binary else (False if name == _MLSERVER else None),
        classification="classification" in extensions,
        generate=name == _TRITON or "generate" in extensions,
        system_shared_memory="system_shared_memory" in extensions,
    )


@dataclass(frozen=True, slots=True)
class TensorMeta:
    """An input or output of a model's metadata."""

    name: str
    #: as the metadata names it ("" when it names none)
    datatype: str
    #: None when the metadata's shape is no list of integers (a missing shape is a scalar's)
    shape: tuple[int, ...] | None


@dataclass(frozen=True, slots=True)
class ModelMeta:
    """A model's metadata (``GET /v2/models/{m}``, gRPC ModelMetadata)."""

    name: str
    versions: tuple[str, ...]
    platform: str
    inputs: tuple[TensorMeta, ...]
    outputs: tuple[TensorMeta, ...]
    #: the answer as it came, for the codecs that check a client's request against it (raw
    #: binary bodies, the generate mapping: their messages name what it lacks)
    raw: dict[str, Any]

    def output(self, name: str) -> TensorMeta | None:
        """The output named ``name``, if the metadata lists it."""
        return next((t for t in self.outputs if t.name == name), None)

    def input(self, name: str) -> TensorMeta | None:
        """The input named ``name``, if the metadata lists it."""
        return next((t for t in self.inputs if t.name == name), None)


def _shape(value: Any) -> tuple[int, ...] | None:
    if isinstance(value, list) and all(type(d) is int for d in value):
        return tuple(value)
    return None


def _tensors(entries: Any) -> tuple[TensorMeta, ...]:
    out = []
    for entry in entries if isinstance(entries, list) else ():
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            continue
        datatype = entry.get("datatype")
        out.append(
            TensorMeta(
                entry["name"],
                datatype if isinstance(datatype, str) else "",
                _shape(entry.get("shape", [])),
            )
        )
    return tuple(out)


def model_meta(meta: Mapping[str, Any]) -> ModelMeta:
    """A model metadata answer, typed (entries that cannot be read are left out)."""
    name, versions, platform = meta.get("name"), meta.get("versions"), meta.get("platform")
    return ModelMeta(
        name=name if isinstance(name, str) else "",
        versions=tuple(str(v) for v in versions) if isinstance(versions, list) else (),
        platform=platform if isinstance(platform, str) else "",
        inputs=_tensors(meta.get("inputs")),
        outputs=_tensors(meta.get("outputs")),
        raw=meta if isinstance(meta, dict) else dict(meta),
    )


@dataclass(frozen=True, slots=True)
class ConfigFacts:
    """What the proxy uses of a model's configuration (Triton's model config)."""

    #: None when there is no config, or it names none
    max_batch_size: int | None = None
    #: ``model_transaction_policy.decoupled``: the model answers a request with a stream
    decoupled: bool = False


#: a model without a configuration (servers that have none: KServe, MLServer)
NO_CONFIG = ConfigFacts()


def config_facts(config: Any) -> ConfigFacts:
    """The facts of a model configuration answer (anything but an object: no config)."""
    if not isinstance(config, Mapping):
        return NO_CONFIG
    mbs = config.get("max_batch_size")
    policy = config.get("model_transaction_policy")
    return ConfigFacts(
        max_batch_size=mbs if isinstance(mbs, int) and not isinstance(mbs, bool) else None,
        decoupled=isinstance(policy, Mapping) and policy.get("decoupled") is True,
    )
