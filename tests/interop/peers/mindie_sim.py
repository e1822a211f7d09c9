"""A MindIE Server stand-in for tests: the native ``POST /infer`` of MindIE's EndPoint, written
from its documentation and source as the project describes it (docs/protocol.md, MindIE). No
MindIE runs without Ascend hardware, so this is the one stand-in of the interop suite; it is a
test fixture, not product code, and imports nothing of v2proxy.

What it does, as MindIE does:

- ``POST /infer``: the body validated in MindIE's order (JSON object; ``inputs``/``input_id``
  present and not both; ``inputs`` a string or a multimodal list, its length in UTF-16 code
  units; ``stream`` a boolean; ``parameters`` an object; then each knob's JSON type and range,
  ``null`` meaning absent, unknown keys ignored). A failure answers 422
  ``{"error": <MindIE's message>, "error_type": "Input Validation Error"}`` with
  ``Connection: close``.
- Non-stream: ``{"generated_text"}``, plus ``details`` (``finish_reason``, ``generated_tokens``,
  ``generated_token_ids``, ``seed``) when ``parameters.details`` is true. The seed is the
  request's, or one drawn here and echoed.
- Stream: ``text/event-stream``, chunked; each event ``data: `` + JSON + a blank line; the first
  token's event carries ``prefill_time`` (ms), later ones ``decode_time``; the last token comes
  in the final event with ``generated_text``, ``details`` (or ``null``) and ``token.text``
  null. No ``[DONE]``.
- A deadline passed (``parameters.timeout`` seconds): non-stream 500 ``Incomplete Generation``
  ``Engine callback timeout: client timeout``; in a stream the raw line of that text (no
  ``data:``) and the end of the body under the 200 already sent.
- ``GET /health``, ``/v2/health/live``, ``/v2/health/ready`` and ``/v2/models/{m}/ready``: 200
  while healthy, a bare 503 (no body) when not; ``GET /v2`` and ``/v2/models/{m}`` as MindIE's.

The toy generator is deterministic: the words of the prompt (text items of a multimodal list;
``t<id>`` for ``input_id``) in a cycle, ``max_new_tokens`` of them (default 20), token ids a CRC
of the word; ``finish_reason`` is always ``length``.

Knobs for tests (CLI flags, ``MINDIE_SIM_*`` environment variables, or at run time ``POST
/sim/knobs`` with a JSON object; ``GET /sim/knobs`` shows them, ``GET /sim/last`` the last
``/infer`` body received, ``POST /sim/reset`` clears both):

- ``latency_ms``: delay before the first token and between tokens;
- ``fail_after``: a stream breaks after that many token events (``fail_mode`` ``timeout``:
  MindIE's raw timeout line then the end of the body; ``abort``: the connection dropped
  without ending the chunked body);
- ``error_status``: every ``/infer`` answers this MindIE error (422, 424, 500 or 503) before
  generating;
- ``healthy``: false makes the health endpoints and ``/infer`` answer a bare 503.

Run: ``python mindie_sim.py --port 1025 [--host 127.0.0.1] [--model-name llama]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import ssl
import time
import zlib
from typing import Any

from aiohttp import web

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
FLT_MAX = 3.40282e38
MAX_MEDIA = 20
MEDIA_KEYS = ("image_url", "video_url", "audio_url")
TIMEOUT_TEXT = "Engine callback timeout: client timeout"

VALIDATION = "Input Validation Error"
#: MindIE's error answers by status: (error_type, message)
ERRORS = {
    422: (VALIDATION, "Failed to tokenize the inputs."),
    424: ("Generation Error", "Failed to build the engine request."),
    500: ("Incomplete Generation", "Failed to get engine response."),
    503: ("Service Unavailable", "The service has been stopped"),
}

DEFAULT_KNOBS: dict[str, Any] = {
    "latency_ms": 0.0,
    "fail_after": None,
    "fail_mode": "timeout",
    "error_status": None,
    "healthy": True,
}


class Invalid(Exception):
    """A validation failure: MindIE's message."""


def _dump(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def utf16_len(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


# ------------------------------------------------------------------ validation (MindIE's order)


def _check_type(params: dict[str, Any], key: str, kind: str) -> Any:
    """The value of ``key`` (None when absent or null) after MindIE's JSON type check."""
    v = params.get(key)
    if v is None:
        return None
    ok = {
        "boolean": isinstance(v, bool),
        "float": _is_number(v),
        "integer": _is_int(v),
        "unsigned": _is_int(v) and v >= 0,
    }[kind]
    if not ok:
        if kind == "unsigned":
            raise Invalid(f"{key} must be unsigned integer type.")
        raise Invalid(f"{key} must be {kind} type.")
    return v


def _range(ok: bool, message: str) -> None:
    if not ok:
        raise Invalid(message)


def validate_parameters(params: dict[str, Any]) -> dict[str, Any]:
    """Each knob's type and range, in MindIE's order; the values it would use."""
    out: dict[str, Any] = {}
    t = _check_type(params, "temperature", "float")
    if t is not None:
        _range(0 < t <= FLT_MAX, f"Parameter temperature must be in (0.0,3.40282e+38], got {t}.")
    k = _check_type(params, "top_k", "integer")
    if k is not None:
        _range(0 < k <= INT32_MAX, f"Parameter top_k must be in -1 || (0,{INT32_MAX}], got {k}")
    p = _check_type(params, "top_p", "float")
    if p is not None:
        _range(0 < p < 1, f"Parameter top_p must be in (0.0,1.0], got {_dump(p)}.")
    tp = _check_type(params, "typical_p", "float")
    if tp is not None:
        _range(0 < tp <= 1, f"Parameter typical_p must be in (0.0,1.0], got {_dump(tp)}.")
    _check_type(params, "do_sample", "boolean")
    seed = _check_type(params, "seed", "unsigned")
    if seed is not None:
        _range(seed <= INT64_MAX, f"Parameter seed must be in [0, {INT64_MAX}], got {seed}.")
    rp = _check_type(params, "repetition_penalty", "float")
    if rp is not None:
        _range(
            0 < rp <= FLT_MAX,
            f"Parameter 'repetition_penalty' must be in (0.0, 3.40282e+38], got {_dump(rp)}.",
        )
    _check_type(params, "watermark", "boolean")
    prio = _check_type(params, "priority", "unsigned")
    if prio is not None:
        _range(1 <= prio <= 5, f"Parameter priority must be in [1,5], got {prio}.")
    timeout = _check_type(params, "timeout", "unsigned")
    if timeout is not None:
        _range(
            0 < timeout <= 65535,
            "Parameter timeout must be strictly positive and small than 65535 seconds, got"
            f" {timeout}.",
        )
    n = _check_type(params, "max_new_tokens", "integer")
    if n is not None:
        _range(0 < n <= INT32_MAX, f"Parameter max_new_tokens must be in (0,{INT32_MAX}], got {n}.")
    details = _check_type(params, "details", "boolean")
    out["max_new_tokens"] = 20 if n is None else n
    out["seed"] = seed if seed is not None else random.randrange(1, 2**31)
    out["timeout"] = 65535 if timeout is None else timeout
    out["details"] = bool(details)
    return out


def _check_multimodal(items: list[Any]) -> list[str]:
    """The words of a multimodal ``inputs`` list (its text items), after MindIE's checks."""
    words: list[str] = []
    media = 0
    for item in items:
        if not isinstance(item, dict):
            raise Invalid("Request param inputs must be a list of objects")
        kind = item.get("type")
        if kind not in ("text", *MEDIA_KEYS):
            raise Invalid(f"Request param type {_dump(kind)} is not supported")
        if "text" in item and not isinstance(item["text"], str):
            raise Invalid("Request param text must be string")
        if not any(key in item for key in MEDIA_KEYS):
            words.extend(str(item.get("text", "")).split())
            continue
        for key in MEDIA_KEYS:
            if key in item and item[key] is None:
                raise Invalid(f"Request param {key} null")
        media += 1
        if media > MAX_MEDIA:
            raise Invalid(f"The number of multimodal url should be no more than {MAX_MEDIA}")
    return words


def validate(body: bytes, max_chars: int) -> tuple[list[str], bool, dict[str, Any]]:
    """(prompt words, stream, parameters) of an /infer body, or Invalid."""
    try:
        obj = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise Invalid("Failed to parse context to json body") from None
    if not isinstance(obj, dict):
        raise Invalid("Failed to parse context to json body")
    inputs, input_id = obj.get("inputs"), obj.get("input_id")
    if inputs is not None and input_id is not None:
        raise Invalid("Input conflict.")
    if inputs is None and input_id is None:
        raise Invalid("Inputs must not be null")
    if input_id is not None:
        if (
            not isinstance(input_id, list)
            or not input_id
            or not all(_is_int(i) and 0 <= i <= 1048576 for i in input_id)
        ):
            raise Invalid("input_id must be a non-empty list of integers in [0, 1048576]")
        words = [f"t{i}" for i in input_id]
    else:
        if isinstance(inputs, list) and inputs:
            words = _check_multimodal(inputs)
            text = json.dumps(inputs, ensure_ascii=False, separators=(",", ":"))
        else:
            text = inputs if isinstance(inputs, str) else ""
            words = text.split()
        length = utf16_len(text)
        if not 0 < length <= max_chars:
            raise Invalid(
                "Inputs must be necessary and data type must be string and length in"
                f" (0, {max_chars}], but the length of inputs is {length}"
            )
    stream = obj.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise Invalid("stream must be boolean type.")
    params = obj.get("parameters")
    if params is not None and not isinstance(params, dict):
        raise Invalid("parameters must be object type.")
    return words, bool(stream), validate_parameters(params or {})


# ------------------------------------------------------------------ the toy engine


def tokens(words: list[str], n: int) -> list[tuple[int, str]]:
    """(id, text) of each generated token: the words in a cycle, space-separated."""
    words = words or ["token"]
    out = []
    for i in range(n):
        word = words[i % len(words)]
        out.append((zlib.crc32(word.encode()) % 32000 + 1, ("" if i == 0 else " ") + word))
    return out


def json_answer(body: Any, status: int = 200, **headers: str) -> web.Response:
    """A JSON answer as MindIE sends it: ``Content-Type: application/json`` (no charset)."""
    data = json.dumps(body, ensure_ascii=False).encode()
    return web.Response(
        body=data, status=status, headers={"Content-Type": "application/json", **headers}
    )


def error_response(status: int, message: str | None = None) -> web.Response:
    kind, default = ERRORS.get(status, ("Bad Request", "Bad Request"))
    body = {"error": message or default, "error_type": kind}
    return json_answer(body, status, Connection="close")


class Simulator:
    def __init__(self, model_name: str, max_chars: int, knobs: dict[str, Any]) -> None:
        self.model_name = model_name
        self.max_chars = max_chars
        self.knobs = {**DEFAULT_KNOBS, **knobs}
        self.last: Any = None
        self.requests = 0
        #: streams whose client went away before their end
        self.disconnects = 0

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/infer", self.infer)
        for path in ("/health", "/v2/health/live", "/v2/health/ready"):
            app.router.add_get(path, self.health)
        app.router.add_get("/v2", self.server_metadata)
        app.router.add_get("/v2/models/{model}", self.model_metadata)
        app.router.add_get("/v2/models/{model}/ready", self.model_ready)
        app.router.add_get("/sim/knobs", self.get_knobs)
        app.router.add_post("/sim/knobs", self.set_knobs)
        app.router.add_get("/sim/last", self.get_last)
        app.router.add_post("/sim/reset", self.reset)
        return app

    # -------------------------------------------------------------- health and metadata

    def _unhealthy(self) -> web.Response | None:
        return None if self.knobs["healthy"] else web.Response(status=503)

    async def health(self, request: web.Request) -> web.Response:
        return self._unhealthy() or json_answer({})

    async def model_ready(self, request: web.Request) -> web.Response:
        if request.match_info["model"] != self.model_name:
            return error_response(404, f"Model {request.match_info['model']} not found")
        return self._unhealthy() or web.Response(status=200)

    async def server_metadata(self, request: web.Request) -> web.Response:
        ext = {"max_iter_times": 512, "prefill_policy_type": 0, "decode_policy_type": 0}
        return json_answer({"name": "MindIE Server", "version": "1.0.0", "extensions": ext})

    async def model_metadata(self, request: web.Request) -> web.Response:
        if request.match_info["model"] != self.model_name:
            return error_response(404, f"Model {request.match_info['model']} not found")
        tensor = {"shape": [-1], "datatype": "UINT32"}
        return json_answer(
            {
                "name": self.model_name,
                "platform": "MindIE Server",
                "inputs": [{"name": "input0", **tensor}],
                "outputs": [{"name": "output0", **tensor}],
            }
        )

    # -------------------------------------------------------------- test knobs

    async def get_knobs(self, request: web.Request) -> web.Response:
        counts = {"requests": self.requests, "disconnects": self.disconnects}
        return web.json_response({**self.knobs, **counts})

    async def set_knobs(self, request: web.Request) -> web.Response:
        update = await request.json()
        unknown = set(update) - set(DEFAULT_KNOBS)
        if unknown:
            return web.json_response({"error": f"unknown knobs {sorted(unknown)}"}, status=400)
        self.knobs.update(update)
        return web.json_response(self.knobs)

    async def get_last(self, request: web.Request) -> web.Response:
        return web.json_response({"body": self.last})

    async def reset(self, request: web.Request) -> web.Response:
        self.knobs = dict(DEFAULT_KNOBS)
        self.last = None
        self.requests = 0
        self.disconnects = 0
        return web.json_response(self.knobs)

    # -------------------------------------------------------------- /infer

    async def infer(self, request: web.Request) -> web.StreamResponse:
        t0 = time.perf_counter()
        raw = await request.read()
        self.requests += 1
        try:
            self.last = json.loads(raw)
        except ValueError:
            self.last = raw.decode("utf-8", "replace")
        if (bad := self._unhealthy()) is not None:
            return bad
        if self.knobs["error_status"] is not None:
            return error_response(int(self.knobs["error_status"]))
        try:
            words, stream, params = validate(raw, self.max_chars)
        except Invalid as exc:
            return error_response(422, str(exc))
        generated = tokens(words, params["max_new_tokens"])
        if stream:
            return await self._stream(request, generated, params, t0)
        try:
            async with asyncio.timeout(params["timeout"]):
                for _ in generated:
                    await self._pause()
        except TimeoutError:
            return error_response(500, TIMEOUT_TEXT)
        body: dict[str, Any] = {"generated_text": "".join(text for _, text in generated)}
        if params["details"]:
            body["details"] = {
                "finish_reason": "length",
                "generated_tokens": len(generated),
                "generated_token_ids": [i for i, _ in generated],
                "seed": params["seed"],
            }
        return json_answer(body)

    async def _pause(self) -> None:
        delay = float(self.knobs["latency_ms"]) / 1000
        if delay > 0:
            await asyncio.sleep(delay)

    async def _stream(
        self,
        request: web.Request,
        generated: list[tuple[int, str]],
        params: dict[str, Any],
        t0: float,
    ) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        try:
            return await self._events(request, resp, generated, params, t0)
        except (ConnectionError, asyncio.CancelledError):
            self.disconnects += 1
            raise

    async def _events(
        self,
        request: web.Request,
        resp: web.StreamResponse,
        generated: list[tuple[int, str]],
        params: dict[str, Any],
        t0: float,
    ) -> web.StreamResponse:
        deadline = t0 + params["timeout"]
        fail_after = self.knobs["fail_after"]
        previous = t0
        for n, (token_id, text) in enumerate(generated):
            await self._pause()
            now = time.perf_counter()
            if now > deadline or (fail_after is not None and n >= int(fail_after)):
                if self.knobs["fail_mode"] == "abort" and request.transport is not None:
                    request.transport.abort()
                    return resp
                await resp.write(TIMEOUT_TEXT.encode())
                await resp.write_eof()
                return resp
            event: dict[str, Any] = {
                "prefill_time": round((now - t0) * 1000) if n == 0 else None,
                "decode_time": None if n == 0 else round((now - previous) * 1000),
            }
            previous = now
            if n < len(generated) - 1:
                event["token"] = {"id": token_id, "text": text}
            else:
                details = None
                if params["details"]:
                    details = {
                        "finish_reason": "length",
                        "generated_tokens": len(generated),
                        "seed": params["seed"],
                    }
                event["generated_text"] = "".join(t for _, t in generated)
                event["details"] = details
                event["token"] = {"id": token_id, "text": None}
            data = json.dumps(event, ensure_ascii=False, separators=(",", ":"))
            await resp.write(b"data: " + data.encode() + b"\n\n")
        await resp.write_eof()
        return resp


def _env_knobs() -> dict[str, Any]:
    knobs: dict[str, Any] = {}
    for key in DEFAULT_KNOBS:
        value = os.environ.get(f"MINDIE_SIM_{key.upper()}")
        if value is not None:
            knobs[key] = json.loads(value) if key != "fail_mode" else value
    return knobs


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="MindIE Server stand-in (native /infer) for tests")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=1025)
    ap.add_argument("--model-name", default="llama")
    ap.add_argument("--max-input-chars", type=int, default=4 * 1024 * 1024)
    ap.add_argument("--latency-ms", type=float)
    ap.add_argument("--fail-after", type=int)
    ap.add_argument("--fail-mode", choices=("timeout", "abort"))
    ap.add_argument("--error-status", type=int, choices=sorted(ERRORS))
    ap.add_argument("--tls-cert", help="serve HTTPS (MindIE's default) with this certificate")
    ap.add_argument("--tls-key")
    args = ap.parse_args(argv)
    knobs = _env_knobs()
    for key in ("latency_ms", "fail_after", "fail_mode", "error_status"):
        if getattr(args, key) is not None:
            knobs[key] = getattr(args, key)
    sim = Simulator(args.model_name, args.max_input_chars, knobs)
    tls = None
    if args.tls_cert:
        tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        tls.load_cert_chain(args.tls_cert, args.tls_key)
    web.run_app(
        sim.app(), host=args.host, port=args.port, print=None, handle_signals=True, ssl_context=tls
    )


if __name__ == "__main__":
    main()
