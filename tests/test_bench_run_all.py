"""bench/run_all.py's parsers read each bench's output format (sample lines copied from the
benches' print statements), and `--list` names every bench script in bench/."""
from __future__ import annotations

import json
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
import run_all  # noqa: E402

SAMPLES = {
    "engine_bench": """prefix cache  prompt=1523 tokens  trials=3
  TTFT cold  median    812.3 ms
  TTFT hit   median     41.0 ms
  speed-up     19.8x  (target >= 5x)
continuous batching  128 prompt + 64 output tokens, rounds=3
   1 concurrent      30.1 output tok/s  ( 1.0x one stream)
  16 concurrent     160.2 output tok/s  ( 5.3x one stream)
single stream  trials=3
  prefill 1,024 tokens  median   1500.2 tok/s
  decode batch 1        median    30.12 ms/token
""",
    "cpu_ops": """ops  (µs per call, median of 15 interleaved rounds of 200 calls; bf16, 272 keys)
  op                 seqs     torch     fused   ratio
  add + rms_norm        1      11.7       4.7   2.51x
  decode attention     16     398.5     145.5   2.74x
decode step  (ms, median of 15 interleaved rounds of 5 steps; int4+bf16, 2 threads)
  seqs  torch ops    fused   ratio
     1       8.56     6.83   1.25x
    16      28.95    22.77   1.27x
""",
    "step_profile": """SmolLM2-135M-Instruct: device cpu, cpu_capability AVX2; 2 threads

decode, 1 sequence (self CPU time of the calling thread, 10 steps)
    op                                            ms/step  share calls/step
    aten::_weight_int4pack_mm_for_cpu               7.456  52.0%      120.0
    aten::_weight_int8pack_mm                       1.580  11.0%        1.0
    outside torch ops (fused C ops, Python)         4.450  31.0%
    step (wall)                                    14.333

prefill, 256 tokens (self CPU time of the calling thread, 2 steps)
    op                                            ms/step  share calls/step
    mkldnn::_linear_pointwise                     286.183  78.1%      120.0
    step (wall)                                   366.559
""",
    "tool_call_grammar_cost": """machine: AMD EPYC, avx512f True, torch AVX512, 2 threads
tool-call grammar cost  64 output tokens, 7 rounds interleaved, greedy, llguidance
  unconstrained  median    11.70 ms/token  (10.64-13.99)
  constrained    median    12.15 ms/token  (11.39-16.55)
  grammar cost   median     0.38 ms/token  (-0.70-4.86)  (+3.2%)
  in-step grammar work median    151.5 us/token  (122.8-928.9)  (mask 97%, accept 3%)
""",
    "model_speed": """model smollm2 on cpu torch.float32, 2 threads
prefill 1024 tokens: 700 ms = 1463 tokens/s
decode, 1 sequence @ 256 ctx: 25.1 ms/token
decode, 16 sequences @ 256 ctx: 60.2 ms/step = 266 tokens/s
""",
    "ingest_bench": """probe ingestion, one core, 5000 beacons in-process (ASGI, no network):
  joined               3,210 beacons/s
  rejected (422)       5,100 beacons/s
through uvicorn on loopback (httpx client in the same process), 500 beacons:
  accepted             1,234 beacons/s
store memory, 20000 records + joined beacons, ring capacity 10,000:
  after  10,000 beacons:    12.5 MiB traced, 10,000 records held
  after  20,000 beacons:    12.6 MiB traced, 10,000 records held
""",
    "tracing_overhead": """round 0 tracing on     120.1 tok/s  TTFT p50   210.0 ms  failed 0
throughput on/off  0.991  (target >= 0.98)
TTFT p50 on/off    1.010  (target <= 1.02)
""",
    "cold_path": """the proxy's steps before the upstream write: hot, and after 20 ms idle (median of 60)
                              step    hot us  after idle us   ratio
                              noop      0.04           13.3    324x
               peek_request (JSON)      4.98          144.6     29x
                  sum of the steps     21.96          666.0  (each step after its own idle; in a request they share one wake-up)
""",
    "relay_floor": """
3 interleaved rounds of 256 streams at concurrency 32, 10 events each; CPU per relayed SSE event of the relaying process:
            nginx:    35.2 us/event  (1.00x nginx)
            proxy:   164.1 us/event  (4.67x nginx)
   proxy-untraced:   113.3 us/event  (3.22x nginx)
              raw:    58.6 us/event  (1.67x nginx)
""",
    "proxy_overhead": """concurrency          target     n   p50 ms   p99 ms  +p50 vs direct  +p99 vs direct
          1          direct    32    1.000    2.000           0.000           0.000
         32           proxy   512    3.100    9.200           2.100           7.200
         32                   proxy - nginx: p50 +0.700 ms, p99 +2.100 ms (target: <= 1 ms, <= 3 ms)

CPU of the relaying process while its own batches ran:
            proxy: 0.412 ms/request, 41.2 us/relayed SSE event (1088 requests, 10 events each; user 0.300 + system 0.112 ms/request)

CPU split, from the same run's 64-event streams at 32 streams (fixed per request + marginal per event):
            nginx: 0.238 ms/request + 14.0 us/event
            proxy: 1.435 ms/request + 21.9 us/event  (6.03x, 1.57x nginx's)
""",
    "step_record_cost": """CPU AMD EPYC  torch capability AVX512  threads 2  model SmolLM2-135M-Instruct
step record  25.24 us per 16-sequence step (tuple + ring + 2 observations)
decode tok/s, 128 prompt + 64 output tokens, rounds=5: median (min-max)
   1 streams  on     30.9  (29.3-31.5)  off     31.2  (30.1-31.8)  on/off 0.990 (0.950-1.027)
  16 streams  on    229.1  (220.0-238.2)  off    230.3  (219.8-240.8)  on/off 0.995 (0.970-1.030)
steps kept 2260 of 2260 (--step-log-size 8192)
""",
    "long_prefill": """server                  long TTFT ms        short TTFT ms        short/long
ours, knob off   17946 (15534-26522)  17745 (15331-26321)  0.99 (0.99-0.99)
ours, knob on    14147 (10038-29708)      1961 (383-4228)  0.14 (0.04-0.14)
short/long, knob on: 0.14 (0.04-0.14)  target <= 0.25: met
long TTFT on/off: 0.91 (0.56-1.12)  target <= 1.1: met
""",
    "wake_cost": """CPU per wake-up of the waking thread, µs (median of 1 rounds of 0.3 s)
   every       timer      notify  loop timer  timer/notify
   200ms       412.2        54.4       764.1         7.58x
     1ms        40.0         8.6        37.3         4.68x
""",
    "proxy_threads": """3 rounds of 64 streams at concurrency 8, 66 events each (192 completed, 0 failed); spans exported
          thread  CPU us/request  wakes/request  idle CPU us/s
      event loop          5066.4          23.74         1294.9
    ttft-records           370.4           1.51          780.4
      ttft-store           118.7           0.32          237.5
   other threads           101.6           0.05          883.0
             all          5657.1
""",
    "proxy_ab": """round 1 nginx  2453.4  .  5941.4  HEAD  5900.1
64 streams of 66 events at concurrency 8 a batch; spans exported
µs per request, median of 1 rounds; paired ratios: to . (range), to nginx (range)
       nginx   2453.4
           .   5941.4  1.000 (1.000-1.000)  2.42x (2.42-2.42)
        HEAD   5900.1  0.993 (0.993-0.993)  2.40x (2.40-2.40)
""",
    "timeline_cost": """CPU AMD EPYC  10000 records in the store, 8192 steps of 16 requests in the ring, trials=7
  timeline, every record   median   383.6 ms  max   588.9 ms  answer 11930.1 KiB  peak   54.2 MiB
  trace + neighbours       median    11.5 ms  max    17.7 ms  answer     5.7 KiB  peak    0.4 MiB
""",
}


def test_each_parser_reads_its_benchs_format():
    parsers = {b.name: b.parse for b in run_all.benches(sys.executable)}
    expected_rows = {"engine_bench": 7, "cpu_ops": 4, "model_speed": 3, "ingest_bench": 4,
                     "tracing_overhead": 2, "proxy_overhead": 6, "relay_floor": 4,
                     "step_profile": 2, "cold_path": 2, "step_record_cost": 3,
                     "timeline_cost": 2, "long_prefill": 2, "tool_call_grammar_cost": 2,
                     "wake_cost": 2, "proxy_threads": 4, "proxy_ab": 2}
    for name, sample in SAMPLES.items():
        rows = parsers[name](sample)
        assert len(rows) == expected_rows[name], (name, rows)
    assert ("prefix cache speed-up", "19.8x", ">= 5x") in parsers["engine_bench"](
        SAMPLES["engine_bench"])
    assert parsers["proxy_threads"](SAMPLES["proxy_threads"])[1] == (
        "proxy CPU by thread: ttft-records",
        "370.4 us/request, 1.51 wakes/request; idle 780.4 us/s", "")
    assert parsers["proxy_ab"](SAMPLES["proxy_ab"])[0] == (
        "proxy CPU a request at ., x nginx (rounds' range)", "5941.4 us (2.42x, 2.42-2.42)",
        "<= 2.5x")
    assert parsers["wake_cost"](SAMPLES["wake_cost"])[1] == (
        "wake-up every 1ms: timer, notify, loop timer", "40.0, 8.6, 37.3 µs (4.68x)", "")
    assert parsers["step_profile"](SAMPLES["step_profile"])[0] == (
        "step profile: decode, 1 sequence",
        "14.333 ms/step (aten::_weight_int4pack_mm_for_cpu 52.0%)", "")


def test_probe_size_target_is_the_classic_builds_budget_only():
    out = ("probe.global.js: raw 19204 B, gzip 7458 B, minified 6539 B, min+gzip 3064 B\n"
           "formats.global.js: raw 4284 B, gzip 1887 B, minified 1298 B, min+gzip 664 B\n"
           "budget (served classic build, gzipped): 3072 B -> ok\n")
    assert run_all.parse_probe_size(out) == [
        ("probe.global.js min+gzip", "3064 B", "<= 3072 B"),
        ("formats.global.js min+gzip", "664 B", ""), ("budget (classic build)", "ok", "ok")]


def test_json_summary_names_the_machine_and_the_benches_left_out(tmp_path, monkeypatch):
    """--json: the CPU, torch's capability, date and commit beside the rows (bench/lib/machine.py)."""
    fake = run_all.Bench("probe_size", [sys.executable, "-c", "print('budget x -> ok')"],
                         run_all.parse_probe_size, 60)
    monkeypatch.setattr(run_all, "benches", lambda python: [fake, run_all.Bench(
        "other", ["false"], run_all.parse_probe_size, 60)])
    out = tmp_path / "summary.json"
    assert run_all.main(["--only", "probe_size", "--out", str(tmp_path), "--json", str(out)]) == 0
    summary = json.loads(out.read_text())
    assert summary["benches_available"] == ["probe_size", "other"]
    assert [b["bench"] for b in summary["benches"]] == ["probe_size"]
    assert summary["benches"][0]["figures"] == [
        {"figure": "budget (classic build)", "value": "ok", "target": "ok"}]
    m = summary["machine"]
    assert m["cpu_model"] and m["cpu_model"] != "unknown" and m["logical_cpus"] >= 1
    assert isinstance(m["avx512f"], bool)
    import torch   # the child process asked the same torch
    assert m["torch_cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert m["date_utc"].endswith(" UTC") and m["git_commit"], m


def test_run_all_covers_every_bench_script():
    listed = subprocess.run([sys.executable, str(REPO / "bench" / "run_all.py"), "--list"],
                            capture_output=True, text=True, check=True).stdout
    # The helpers live in bench/lib/, so every file directly in bench/ is a script.
    scripts = {p.name for p in (REPO / "bench").iterdir()
               if p.suffix in (".py", ".mjs") and p.name != "run_all.py"}
    assert scripts and all(f"bench/{s}" in listed for s in scripts), listed
