"""Client shared memory as stages of the pipeline (docs/protocol.md, shared memory): who may use
it, and per inference request stage 3 (inputs read from the client's registered regions), stage 4
(outputs planned into them) and stage 6 (the backend's outputs written there)."""

from __future__ import annotations

import ipaddress
from typing import Any

from v2proxy.codecs.classification import WITH_SHM
from v2proxy.codecs.dtypes import check_tensor_size
from v2proxy.core.errors import Forbidden, InvalidRequest, NotFound, ProxyError, Unsupported
from v2proxy.core.model import Buffer, InferRequest, InferResponse
from v2proxy.core.regions import Region, Regions
from v2proxy.core.stages.base import Applied

REGION = "shared_memory_region"
OFFSET = "shared_memory_offset"
BYTE_SIZE = "shared_memory_byte_size"
SHM_PARAMS = frozenset({REGION, OFFSET, BYTE_SIZE})
#: the largest size_t: Triton's overflow check compares against it
SIZE_MAX = 2**64 - 1
CLIENT_SHM_MODES = ("off", "local", "on")
WITH_BINARY = "Output can't set both 'shared_memory_region' and 'binary_data'"


def is_local(peer: str | None) -> bool:
    """Whether a client address is on this host: None (a unix socket) or a loopback IP."""
    if peer is None:
        return True
    try:
        ip = ipaddress.ip_address(peer.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped.is_loopback
    return ip.is_loopback


#: the peer of a request whose frontend did not say where it came from: never local
UNKNOWN_PEER = ""


def check_client(mode: str, peer: str | None) -> None:
    """``--client-shm``: may this client use shared memory at all (register, status,
    unregister, or name a region in an inference)? ``peer``: its IP address, None on a unix
    socket, :data:`UNKNOWN_PEER` when unknown."""
    if mode == "on":
        return
    if mode == "off":
        raise Unsupported(
            "Client shared memory is disabled: this v2proxy was started with --client-shm off"
        )
    if not is_local(peer):
        raise Forbidden(
            "Client shared memory is allowed only from loopback or a unix socket"
            " (--client-shm local): this client connected from another host"
        )


def locate(name: str, region_size: int, offset: int, byte_size: int) -> None:
    """Triton's checks of a tensor's place in a region (``GetMemoryInfo``), in its order."""
    if offset >= region_size:
        raise InvalidRequest(f"Invalid offset for shared memory region: '{name}'")
    if byte_size > SIZE_MAX - offset:
        raise InvalidRequest(
            f"Integer overflow detected: byte_size ({byte_size}) + offset ({offset}) exceeds"
            f" maximum value ({SIZE_MAX}) for region '{name}'"
        )
    if offset + byte_size > region_size:
        raise InvalidRequest(f"Invalid offset + byte size for shared memory region: '{name}'")


def _reference(params: dict[str, Any], tensor: str) -> tuple[str, int, int]:
    """(region, offset, byte_size) of a tensor's shm parameters (HTTP rules: offset and
    byte_size default to 0)."""
    region = params[REGION]
    if not isinstance(region, str):
        raise InvalidRequest(
            f"invalid value type for '{REGION}' parameter for tensor '{tensor}', expected"
            " string_param."
        )
    values = []
    for key in (OFFSET, BYTE_SIZE):
        v = params.get(key, 0)
        if type(v) is not int or v < 0:
            raise InvalidRequest(
                f"invalid value for '{key}' parameter for tensor '{tensor}', expected a"
                " non-negative integer"
            )
        values.append(v)
    return region, values[0], values[1]


def _without_shm(params: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in params.items() if k not in SHM_PARAMS}


class Use:
    """The regions one request holds, and where its shm outputs go."""

    __slots__ = ("held", "outputs", "regions")

    def __init__(self, regions: Regions) -> None:
        self.regions = regions
        self.held: dict[str, Region] = {}
        #: output name -> (region, offset, byte_size)
        self.outputs: dict[str, tuple[Region, int, int]] = {}

    def acquire(self, name: str) -> Region:
        region = self.held.get(name)
        if region is None:
            region = self.regions.acquire(name)
            self.held[name] = region
        return region

    def release(self) -> None:
        """Give every region back (idempotent); an unregister waiting on them completes."""
        held, self.held = self.held, {}
        for region in held.values():
            self.regions.release(region)

    def write_outputs(self, response: InferResponse) -> None:
        """Stage 6: each planned output's bytes into its region, checked to fit (Triton's 500 text
        otherwise) and the region's object checked to still be whole; ``in_shm`` ones are skipped.
        """
        written = 0
        for t in response.outputs:
            target = self.outputs.get(t.name)
            if target is None or t.in_shm:
                continue
            _write(t.name, *target, t.data)
            t.data = b""
            t.parameters = {}
            t.in_shm = True
            written += 1
        if written:
            self.regions.served("output", written)


def _write(name: str, region: Region, offset: int, size: int, data: Buffer) -> None:
    n = memoryview(data).nbytes
    if n > size:
        raise ProxyError(
            f"shared memory size specified with the request for output '{name}'"
            f" ({size} bytes) should be at least {n} bytes to hold the results"
        )
    if n:
        region.check()
        region.write(offset, data)


class _Sink:
    """An output's place in the client's region, as :attr:`RequestedOutput.sink`."""

    __slots__ = ("capacity", "name", "offset", "region", "regions")

    def __init__(self, name: str, region: Region, offset: int, size: int, regions: Regions):
        self.name = name
        self.region = region
        self.offset = offset
        self.capacity = size
        self.regions = regions

    def write(self, data: Buffer) -> None:
        _write(self.name, self.region, self.offset, self.capacity, data)
        self.regions.served("output", 1)


def resolve(
    request: InferRequest,
    regions: Regions | None,
    mode: str = "local",
    peer: str | None = UNKNOWN_PEER,
) -> Use | None:
    """Stages 3 and 4 for shared memory: None when the request names no region (one dict lookup per
    tensor that has parameters); else a :class:`Use` holding the regions (released here on failure).
    """
    inputs = [t for t in request.inputs if t.parameters and REGION in t.parameters]
    outputs = [o for o in request.outputs or () if o.parameters and REGION in o.parameters]
    if not inputs and not outputs:
        return None
    for o in outputs:  # parse-time errors first, as Triton's frontends raise them
        if "classification" in o.parameters:
            raise InvalidRequest(WITH_SHM)
        if o.parameters.get("binary_data") is True:
            raise InvalidRequest(WITH_BINARY)
    check_client(mode, peer)
    refs = [_reference(t.parameters, t.name) for t in inputs]
    out_refs = [_reference(o.parameters, o.name) for o in outputs]
    if regions is None:
        name = (refs or out_refs)[0][0]
        raise NotFound(f"Unable to find shared memory region: '{name}'")
    use = Use(regions)
    try:
        for t, (name, offset, size) in zip(inputs, refs, strict=True):
            region = use.acquire(name)
            locate(name, region.byte_size, offset, size)
            region.check()
            t.data = region.read(offset, size)
            t.parameters = _without_shm(t.parameters)
            check_tensor_size(t, f"input '{t.name}' for model '{request.model_name}'")
        for o, (name, offset, size) in zip(outputs, out_refs, strict=True):
            region = use.acquire(name)
            locate(name, region.byte_size, offset, size)
            use.outputs[o.name] = (region, offset, size)
            o.sink = _Sink(o.name, region, offset, size, regions)
            o.parameters = _without_shm(o.parameters)
            o.parameters.pop("binary_data", None)
    except BaseException:
        use.release()
        raise
    if inputs:
        regions.served("input", len(inputs))
    return use


class SharedMemoryStage:
    """Client shared memory as a :class:`~v2proxy.core.stages.base.Stage`:
    the clients' regions (None: none can be registered) and ``--client-shm``."""

    __slots__ = ("mode", "regions")

    input_keys = frozenset({REGION})
    output_keys = frozenset({REGION})

    def __init__(self, regions: Regions | None, mode: str = "local") -> None:
        self.regions = regions
        self.mode = mode

    def applies(self, request: InferRequest, peer: str | None) -> Applied | None:
        """The request's hold on its regions when a tensor names one, else None."""
        for t in request.inputs:
            if t.parameters and REGION in t.parameters:
                return _Held(self, peer)
        for o in request.outputs or ():
            if o.parameters and REGION in o.parameters:
                return _Held(self, peer)
        return None


class _Held:
    """One request's use of shared memory: its regions, held from ``before`` to ``release``."""

    __slots__ = ("peer", "stage", "use")

    def __init__(self, stage: SharedMemoryStage, peer: str | None) -> None:
        self.stage = stage
        self.peer = peer
        self.use: Use | None = None

    async def before(self, request: InferRequest) -> InferRequest:
        """The client checked, the inputs read, the outputs planned (:func:`resolve`); the
        request is changed in place."""
        self.use = resolve(request, self.stage.regions, self.stage.mode, self.peer)
        return request

    async def after(self, response: InferResponse) -> InferResponse:
        if self.use is not None:
            self.use.write_outputs(response)
        return response

    def release(self) -> None:
        if self.use is not None:
            self.use.release()
