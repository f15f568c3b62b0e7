"""``--profile``: record a window of training steps, as Megatron-LM's flags do.

Steps ``--profile-step-start`` < n <= ``--profile-step-end`` (the iterations logged as
start+1 ... end) are recorded on the ranks ``--profile-ranks``, either

* with the PyTorch profiler (``--use-pytorch-profiler``): a Chrome/Perfetto trace per rank,
  ``rankR.*.pt.trace.json`` in ``--tensorboard-dir`` (CPU operators and, on GPUs, CUDA
  kernels); or
* for Nsight Systems (GPU): ``cudaProfilerStart``/``Stop`` around the window, with NVTX
  ranges for every operator; run under
  ``nsys profile --capture-range=cudaProfilerApi --capture-range-end=stop``.

Each recorded step is one range named ``iteration N``, N as in the training log.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..config.run_config import LoggingConfig


class StepProfiler:
    """Call :meth:`step_starts` before each training step and :meth:`step_ended` after it,
    with the number of completed steps; :meth:`close` when the loop ends early."""

    def __init__(self, config: LoggingConfig, device: str, rank: int):
        self.on = config.profile and rank in config.profile_ranks
        self.config, self.device, self.rank = config, device, rank
        self.torch_profiler: Optional[torch.profiler.profile] = None
        self.nvtx = None
        self.step_range: Optional[torch.profiler.record_function] = None

    def step_starts(self, completed: int) -> None:
        if not self.on:
            return
        if completed == self.config.profile_step_start:
            self._start()
        if self.torch_profiler is not None or self.nvtx is not None:
            self.step_range = torch.profiler.record_function(f"iteration {completed + 1}")
            self.step_range.__enter__()

    def _start(self) -> None:
        a = self.config
        if a.use_pytorch_profiler:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if self.device == "cuda":
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self.torch_profiler = torch.profiler.profile(
                activities=activities, record_shapes=True,
                on_trace_ready=torch.profiler.tensorboard_trace_handler(
                    a.tensorboard_dir, worker_name=f"rank{self.rank}"))
            self.torch_profiler.start()
        else:
            torch.cuda.cudart().cudaProfilerStart()
            self.nvtx = torch.autograd.profiler.emit_nvtx(record_shapes=True)
            self.nvtx.__enter__()
        print(f"[fixedcode] rank {self.rank}: profiling iterations {a.profile_step_start + 1}"
              f"-{a.profile_step_end}", flush=True)

    def step_ended(self, completed: int) -> None:
        if self.step_range is not None:
            self.step_range.__exit__(None, None, None)
            self.step_range = None
        if completed >= self.config.profile_step_end:
            self.close()

    def close(self) -> None:
        if self.torch_profiler is not None:
            self.torch_profiler.stop()  # writes the trace
            self.torch_profiler = None
            print(f"[fixedcode] rank {self.rank}: profiler trace written to "
                  f"{self.config.tensorboard_dir}", flush=True)
        if self.nvtx is not None:
            torch.cuda.synchronize()
            self.nvtx.__exit__(None, None, None)
            torch.cuda.cudart().cudaProfilerStop()
            self.nvtx = None
