"""Where a served step's host time goes: a py-spy profile of the running server, by phase.

Reads the folded stacks `bench/serve_overhead.py --profile` writes (one line per distinct
stack: `thread (tid): NAME;frame;frame;... COUNT`, sampled at --hz) and the JSON of the
same run (its level's served tokens and device launches), and assigns every sample to
one host phase: the phase of the deepest frame that a rule below names (so time in the
detokenizer under the worker's output work counts as detokenize, not as the output
work). Per thread and phase it prints and records microseconds per served token and per
device launch (one launch is one step; at full batch a decode step has C rows).

    python bench/serve_phases.py --folded bench/out/serve_overhead_c256_i1.folded \
        --run bench/out/serve_overhead.json [--gil-folded F --gil-run J] --json OUT.json

With --gil-folded/--gil-run (the same level profiled with --profile-gil: only the thread
holding the GIL is sampled), each thread's busy-but-not-holding time per token (wall
samples minus GIL-held samples, both per served token) is reported as its GIL wait: the
hand-off cost of two busy threads in one process. The two runs are separate, so that
figure is the difference of two measurements on a shared host (read it as a magnitude).

Figures only; nothing here is asserted on.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
from pathlib import Path

from _report import git_commit, write_json  # bench/ is this script's folder

REPO = Path(__file__).resolve().parent.parent

# (phase, substrings of a frame): the deepest frame matching a rule decides the phase;
# rules are tried in this order for that frame.
PHASES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("packing host values", ("SharedPacking.", "runtime/packing.py")),
    ("step submission", ("NativeModel.submit", "PacedBackend.launch", "ModelWorker._submit",
                         "ModelWorker._with_masks", "cuda_backend.py")),
    ("sampling readback", ("NativeModel.wait", "NativeModel._completion", "PacedBackend.wait",
                           "ModelWorker._complete_oldest", "ModelWorker._logprobs")),
    ("scheduler schedule", ("Scheduler.schedule", "Scheduler.can_schedule_ahead")),
    ("scheduler complete", ("Scheduler.complete", "Lifecycle.complete", "RowResult.")),
    ("detokenize", ("IncrementalDetokenizer.", "ByteLevelPieces.", "StepDetokenizer.",
                    "frontend/detokenizer.py")),
    ("stop matching", ("check_stop", "StringStopMatcher.", "TokenStopMatcher.",
                       "frontend/stops.py", "scheduler/finish.py")),
    ("parsers (reasoning/tools)", ("frontend/reasoning.py", "frontend/tools.py",
                                   "frontend/recipient.py", "OutputPipeline._parse",
                                   "OutputPipeline._route", "OutputPipeline._publish",
                                   "coalesce")),
    ("output pipeline (other)", ("OutputPipeline.", "TokenRelay.")),
    ("validate + latency metrics", ("ModelWorker._validate", "ModelWorker._observe_latency",
                                    "HistogramBatch.")),
    ("event publication (worker)", ("ModelWorker._feed", "ModelWorker._finish",
                                    "ModelWorker._flush_outputs", "ModelWorker._deliver",
                                    "ModelWorker._publish_step", "deliver (",
                                    "SinkBase._accept", "_Mailbox.post", "EngineDelivery.",
                                    "engine_process.py")),
    ("gauges", ("ModelWorker._publish_gauges",)),
    ("asyncio wakeups (loop)", ("_Mailbox._take", "EventSink._put_all", "EventSink.get",
                                "next_event", "EngineClient._on_readable",
                                "EngineClient._dispatch", "engine_client.py")),
    ("SSE framing / JSON", ("ChatShapes.", "CompletionShapes.", "_delta_json", "merge (",
                            "_apply (", "http/responses.py", "SseStream.events")),
    ("ASGI send path", ("ASGIStreamingResponse.", "RequestResponseCycle.send", "wrapped_send",
                        "capture_response_started", "before_send", "http/access.py")),
    ("request intake + preparation", ("Preparer.", "chat_completions", "HTTPRoute.",
                                      "RequestResponseCycle.run_asgi", "ApiService.",
                                      "frontend/prepare.py", "httptools_impl.py",
                                      "ThreadPoolExecutor.submit")),
    ("scheduler (other)", ("helios_serve/scheduler/",)),
)
IDLE = ("PacedBackend.wait", "EpollSelector.select", "Runner.run (", "Condition.wait",
        "_worker (", "serve_child.<locals>.answer", "Event.wait", "select (", "poll (")


# Time inside the scheduler's own helpers belongs to the scheduler call above it.
SCHEDULER_CALLS = (("Scheduler.schedule", "scheduler schedule"),
                   ("Scheduler.complete", "scheduler complete"),
                   ("Scheduler.finish", "scheduler finish (pages released)"),
                   ("Scheduler.add", "scheduler admission"))


def phase_of(frames: list[str]) -> str:
    for frame in reversed(frames):
        for phase, needles in PHASES:
            if any(n in frame for n in needles):
                if phase == "scheduler (other)":
                    for call, named in SCHEDULER_CALLS:
                        if any(call + " (" in f for f in frames):
                            return named
                return phase
    return "other"


def read_folded(path: Path, gil: bool = False) -> dict[str, dict[str, int]]:
    """thread name -> phase -> samples. A wall profile's idle leaves count as 'idle'; in a
    GIL profile every sample holds the GIL, and a leaf that is a wait there is the event
    loop's own native code (uvloop: callbacks, socket writes) or a hand-off in progress."""
    out: dict[str, dict[str, int]] = {}
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        name = frames[0].split(": ", 1)[-1]
        if name.startswith("helios-prepare"):
            name = "helios-prepare"
        waiting = any(frames[-1].startswith(w) for w in IDLE)
        phase = (("event loop native / GIL hand-off" if gil else "idle") if waiting
                 else phase_of(frames[1:]))
        t = out.setdefault(name, {})
        t[phase] = t.get(phase, 0) + int(count)
    return out


def level_of(run: Path, concurrency: int | None) -> dict:
    levels = [lv for lv in json.loads(run.read_text())["levels"] if "served" in lv]
    if concurrency is not None:
        levels = [lv for lv in levels if lv["concurrency"] == concurrency]
    return levels[-1]


def table(folded: Path, level: dict, hz: int) -> dict:
    tokens, launches = level["served"]["tokens"], level["served"]["launches"]
    gil = "gil_us_per_token" in level["served"]  # profiled with --profile-gil
    out = {}
    for thread, phases in read_folded(folded, gil).items():
        busy = {p: n for p, n in phases.items() if p != "idle"}
        if not busy:
            continue
        out[thread] = {p: {"us_per_token": n / hz / tokens * 1e6,
                           "us_per_launch": n / hz / max(1, launches) * 1e6}
                       for p, n in sorted(busy.items(), key=lambda kv: -kv[1])}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--folded", required=True,
                    help="the folded stacks (a wall profile, or a --profile-gil one alone)")
    ap.add_argument("--run", required=True, help="serve_overhead.py's JSON of that profile")
    ap.add_argument("--gil-folded", help="the same level's --profile-gil stacks")
    ap.add_argument("--gil-run", help="its serve_overhead.py JSON")
    ap.add_argument("--concurrency", type=int)
    ap.add_argument("--hz", type=int, default=500, help="py-spy's --rate (serve_overhead: 500)")
    ap.add_argument("--label", default="")
    ap.add_argument("--json", default=str(REPO / "bench" / "out" / "serve_phases.json"))
    args = ap.parse_args()
    level = level_of(Path(args.run), args.concurrency)
    wall = table(Path(args.folded), level, args.hz)
    result = {"label": args.label, "commit": git_commit(REPO),
              "profile": "gil" if "gil_us_per_token" in level["served"] else "wall",
              "concurrency": level["concurrency"], "tokens": level["served"]["tokens"],
              "launches": level["served"]["launches"],
              "tokens_per_launch": level["served"]["tokens_per_launch"],
              "wall_profile": wall,
              "host": {"machine": platform.machine(), "cpus": os.cpu_count(),
                       "python": platform.python_version(), "loadavg_1m": os.getloadavg()[0]}}
    print(f"C={level['concurrency']}  {level['served']['tokens_per_launch']:.1f} tokens per launch")
    for thread, phases in wall.items():
        total = sum(v["us_per_token"] for v in phases.values())
        print(f"  {thread}: {total:.1f} us/token busy ({total * level['served']['tokens_per_launch']:.0f}"
              f" us per launch)")
        for p, v in phases.items():
            print(f"    {p:<34} {v['us_per_token']:6.2f} us/token  {v['us_per_launch']:8.1f} us/launch")
    if args.gil_folded and args.gil_run:
        gil_level = level_of(Path(args.gil_run), args.concurrency)
        gil = table(Path(args.gil_folded), gil_level, args.hz)
        result["gil_profile"] = gil
        result["gil_wait_us_per_token"] = {}
        print("  GIL held / wall busy / difference (the GIL wait), us per token:")
        for thread in wall:
            w = sum(v["us_per_token"] for v in wall[thread].values())
            g = sum(v["us_per_token"] for v in gil.get(thread, {}).values())
            result["gil_wait_us_per_token"][thread] = w - g
            print(f"    {thread:<22} {g:6.1f} / {w:6.1f} / {w - g:6.1f}")
    print(f"wrote {write_json(args.json, result)}")


if __name__ == "__main__":
    main()
