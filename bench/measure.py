"""Shared by the benchmarks in bench/: the machine description, a timer, a peak-memory meter,
and running one measurement in its own process.

Memory means the same on both devices: the peak while the timed calls run, minus the memory
in use before the thing measured was built. On a GPU, ``torch.cuda.max_memory_allocated``
(tensors only, not the caching allocator's reserve); on a CPU, the process's resident set
(peak: ``VmHWM``), so each measurement runs in a fresh process (:func:`run_child`).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time

import psutil
import torch


def device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def machine() -> str:
    """One line: CPU model, cores usable by this process, load average (other jobs share
    the machine), GPU (if any), torch version."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    threads = "" if torch.cuda.is_available() else ", measured with OMP_NUM_THREADS=1"
    return (f"{cpu}, nproc {len(os.sched_getaffinity(0))}{threads}, load average {load}, "
            f"{gpu}, torch {torch.__version__}, Python {platform.python_version()}")


def clocks() -> tuple:
    """The :func:`time_ms` clocks worth reporting here: CPU time means nothing for a GPU run."""
    return ("wall",) if torch.cuda.is_available() else ("wall", "cpu")


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def time_ms(fn, warmup: int, reps: int) -> dict:
    """Medians over ``reps`` calls of ``fn()``, in milliseconds: ``wall`` (the GPU synchronised
    around each call) and ``cpu``, this process's CPU time (user + system, all threads), which
    other jobs on a shared machine inflate far less than wall time."""
    return time_interleaved_ms({"": fn}, warmup, reps)[""]


def time_interleaved_ms(fns: dict, warmup: int, reps: int) -> dict:
    """:func:`time_ms` of each of ``fns`` (name -> function), their calls taking turns, so that
    a change of the machine's load weighs on all of them alike: ``{name: {"wall", "cpu"}}``."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times = {name: {"wall": [], "cpu": []} for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            sync()
            start, start_cpu = time.perf_counter(), time.process_time()
            fn()
            sync()
            times[name]["wall"].append((time.perf_counter() - start) * 1e3)
            times[name]["cpu"].append((time.process_time() - start_cpu) * 1e3)
    return {name: {clock: statistics.median(values) for clock, values in t.items()}
            for name, t in times.items()}


def memory_now() -> int:
    """Bytes in use: GPU tensors, or this process's resident set."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        return torch.cuda.memory_allocated()
    return psutil.Process().memory_info().rss


def reset_peak() -> None:
    """Start a new peak at :func:`memory_now` (on Linux, ``/proc/self/clear_refs`` resets the
    resident-set high-water mark)."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    else:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")


def peak_memory() -> int:
    """Peak bytes since :func:`reset_peak`."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated()
    with open("/proc/self/status") as f:
        line = next(line for line in f if line.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


MEMORY_KIND = (
    "peak during the timed calls minus the memory in use before the module was built "
    "(parameters, gradients, optimizer state, activations; not the one-off initialisation): "
    + ("torch.cuda.max_memory_allocated" if torch.cuda.is_available() else
       "peak resident set (VmHWM, reset after building), fresh process per row"))


CPU_THREADS = {"OMP_NUM_THREADS": "1"}


def run_child(script: str, *args: str) -> dict:
    """Run ``python script --child args...`` and return the JSON it prints last. On a CPU the
    child runs one thread (:data:`CPU_THREADS`): on a shared machine, idle OpenMP threads
    spinning at barriers make multi-threaded timings erratic."""
    env = dict(os.environ) if torch.cuda.is_available() else {**os.environ, **CPU_THREADS}
    done = subprocess.run([sys.executable, script, "--child", *args], capture_output=True,
                          text=True, env=env)
    if done.returncode:
        raise SystemExit(f"measurement {args} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def emit(result: dict) -> None:
    """The child's answer to :func:`run_child`."""
    print(json.dumps(result), flush=True)


def graph_time_ms(fn, reps: int, inner: int = 10) -> float:
    """GPU time of ``fn()`` in milliseconds, without host launch overhead: ``inner`` calls are
    captured in a CUDA graph, replayed ``reps`` times between CUDA events."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(inner):
            fn()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / (reps * inner)
