"""Process start-up: device choice, torch.distributed, Megatron's parallel state and seeds.

Rank and world size come from the environment (``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` as set
by torchrun, else Slurm's ``SLURM_PROCID``/``SLURM_NTASKS``/``SLURM_LOCALID``); a single process
needs none of them.
"""

from __future__ import annotations

import os
import random
import socket

import numpy as np
import torch

from megatron.core import parallel_state, tensor_parallel

from .errors import DeviceError


def _env_int(names, default: int) -> int:
    for name in names:
        if os.environ.get(name):
            return int(os.environ[name])
    return default


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def resolve_device(requested: str) -> str:
    """``auto`` -> ``cuda`` when a GPU is visible, else ``cpu``."""
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        raise DeviceError("--device cuda, but no GPU is visible to this process")
    return requested


def world_size_from_env() -> int:
    """The job's number of ranks, from the environment (1 for a lone process)."""
    return _env_int(["WORLD_SIZE", "SLURM_NTASKS"], 1)


def initialize_distributed(device: str, tensor_parallel_size: int = 1,
                           pipeline_parallel_size: int = 1, seed: int = 1234) -> None:
    """Start torch.distributed (gloo on CPU, nccl on GPU) and Megatron's model-parallel groups
    (the world a whole number of model replicas: ``config.parallel_config.ParallelConfig.
    check_world``, which the training loop calls first)."""
    if device == "cpu":
        from . import cpu_backend
        cpu_backend.enable()
    rank = _env_int(["RANK", "SLURM_PROCID"], 0)
    world_size = world_size_from_env()
    local_rank = _env_int(["LOCAL_RANK", "SLURM_LOCALID"], 0)
    if not torch.distributed.is_initialized():
        if world_size == 1 and "MASTER_PORT" not in os.environ:
            # A lone process rendezvouses with itself on a free port; the environment is left
            # untouched, so processes it starts pick their own.
            init_method = f"tcp://127.0.0.1:{_free_port()}"
        elif "MASTER_PORT" not in os.environ:
            raise DeviceError("MASTER_PORT is not set for a multi-process run")
        else:
            init_method = (f"tcp://{os.environ.get('MASTER_ADDR', '127.0.0.1')}:"
                           f"{os.environ['MASTER_PORT']}")
        if device == "cuda":
            torch.cuda.set_device(local_rank)
        torch.distributed.init_process_group(
            backend="nccl" if device == "cuda" else "gloo", rank=rank, world_size=world_size,
            init_method=init_method)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=tensor_parallel_size,
            pipeline_model_parallel_size=pipeline_parallel_size)
    set_seed(seed)


def set_seed(seed: int) -> None:
    """Seed every generator; each pipeline stage gets its own stream, as in Megatron-LM."""
    seed = seed + 100 * parallel_state.get_pipeline_model_parallel_rank()
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    tensor_parallel.model_parallel_cuda_manual_seed(seed)


def destroy_distributed() -> None:
    parallel_state.destroy_model_parallel()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
