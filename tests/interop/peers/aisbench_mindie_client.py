"""Drive AISBench's MindIE client, ``MindieStreamApi``, against a server's ``POST /infer``.

Runs in the AISBench venv (setup_peers.sh), never in v2proxy's own::

    DIR/aisbench/bin/python aisbench_mindie_client.py HOST PORT MAX_OUT_LEN PROMPT...

For each prompt, one JSON line on stdout: what the client made of the stream (its ``success``,
``content`` — the ``generated_text`` it read — ``error_info``) and how many time points it
recorded (one per event, plus the request's start), exactly as AISBench's benchmark sees them.
"""

from __future__ import annotations

import asyncio
import json
import sys


async def main(host: str, port: int, max_out_len: int, prompts: list[str]) -> None:
    from ais_bench.benchmark.models import MindieStreamApi
    from ais_bench.benchmark.models.output import RequestOutput

    model = MindieStreamApi(
        host_ip=host,
        host_port=port,
        max_out_len=max_out_len,
        retry=1,
        generation_kwargs={"temperature": 0.01, "ignore_eos": False},
    )
    for prompt in prompts:
        output = RequestOutput(perf_mode=True)
        await model.generate(prompt, max_out_len, output)
        line = {
            "success": output.success,
            "content": output.content,
            "error_info": output.error_info,
            "time_points": len(output.time_points),
        }
        print(json.dumps(line, ensure_ascii=False), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]))
