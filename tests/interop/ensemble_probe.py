"""What the toy TensorRT-LLM ``ensemble`` of the Triton peer (peers/triton_models/ensemble) tells
of cancellations: its count of requests seen cancelled, asked straight from Triton with the
``[cancelled?]`` prompt. For the tests that show a client's going away (or a stop sequence)
cancels the backend's work."""

from __future__ import annotations

import contextlib
import http.client
import json
import time


def cancelled(triton_http: str) -> int:
    """The ensemble's count of requests seen cancelled so far (``triton_http``: its REST URL)."""
    host = triton_http.removeprefix("http://")
    with contextlib.closing(http.client.HTTPConnection(host, timeout=30)) as conn:
        body = json.dumps({"text_input": "[cancelled?]", "max_tokens": 1})
        conn.request("POST", "/v2/models/ensemble/generate", body)
        answer = json.loads(conn.getresponse().read())
    return int(answer["text_output"])


def settled(triton_http: str) -> int:
    """The count once it has stopped moving: an earlier test's cancellation may reach the model
    late (it sees one at its next token, up to a few hundred ms away), and must not be counted
    as the next test's."""
    count = cancelled(triton_http)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = cancelled(triton_http)
        if now == count:
            return count
        count = now
    return count
