"""Running the training entry point as a subprocess and signalling it mid-run."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from conftest import PRETRAIN


def signal_run(args, sig, when=None, delay: float = 0.0, env=None, again_when=None):
    """Run pretrain_fixedcode.py and send it ``sig`` ``delay`` seconds after the first line
    of output containing ``when`` (None: ``delay`` seconds after the start), and once more
    on the first line containing ``again_when``; returns ``(exit code, output, metrics
    records)``."""
    from megatron_ext.metrics.sinks import read_metrics
    metrics = args[args.index("--save") + 1] / "metrics.jsonl"
    proc = subprocess.Popen([sys.executable, str(PRETRAIN), *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, **(env or {})})
    lines = []
    if when is not None:
        for line in proc.stdout:
            lines.append(line)
            if when in line:
                break
    time.sleep(delay)
    proc.send_signal(sig)
    if again_when is not None:
        for line in proc.stdout:
            lines.append(line)
            if again_when in line:
                time.sleep(0.5)  # into the interpreter's shutdown
                proc.send_signal(sig)
                break
    rest, _ = proc.communicate(timeout=180)
    out = "".join(lines) + rest
    return proc.returncode, out, read_metrics(str(metrics)) if metrics.exists() else []
