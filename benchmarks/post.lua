-- wrk script of the v2proxy benchmark: POST a pre-built body file with given headers.
--
--   BENCH_BODY=/tmp/x/simple.json BENCH_HEADERS=$'Content-Type: application/json' \
--     wrk -t1 -c16 -d10s --latency -s benchmarks/post.lua http://127.0.0.1:9000/v2/models/simple/infer
--
-- BENCH_BODY: the file whose bytes are the body of every request (read once per thread).
-- BENCH_HEADERS: "Name: value" lines separated by newlines (Content-Type,
--   Inference-Header-Content-Length, ...). wrk adds Host and Content-Length itself.
-- done() prints one line "BENCH_JSON {...}" with exact counts and latency percentiles in
-- microseconds, which run.py parses (wrk's own text report rounds them).

local body_path = os.getenv("BENCH_BODY")
assert(body_path, "BENCH_BODY is not set")
local f = assert(io.open(body_path, "rb"))
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()

for line in (os.getenv("BENCH_HEADERS") or ""):gmatch("[^\n]+") do
  local name, value = line:match("^%s*([^:]+):%s*(.-)%s*$")
  if name then
    wrk.headers[name] = value
  end
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'BENCH_JSON {"requests":%d,"duration_us":%d,"bytes":%d,' ..
    '"p50_us":%d,"p90_us":%d,"p99_us":%d,"mean_us":%.3f,"max_us":%d,"min_us":%d,' ..
    '"err_connect":%d,"err_read":%d,"err_write":%d,"err_status":%d,"err_timeout":%d}\n',
    summary.requests, summary.duration, summary.bytes,
    latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency.mean, latency.max, latency.min,
    e.connect, e.read, e.write, e.status, e.timeout))
end
