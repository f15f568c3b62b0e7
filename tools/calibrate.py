"""The calibration suite (megatron_ext/study/calibration/): every interval a study report
prints, simulated from a known truth across the scenarios that break intervals, with its
coverage or false-positive rate and the band it must lie in. Writes ``calibration.json``
and ``calibration.md`` (the table, with the command, machine and time) into
``--output-dir``; exits with an error naming the rows outside their band.
Usage::

    python tools/calibrate.py --trials 2000 --output-dir docs/calibration   # the docs' table
    python tools/calibrate.py --trials 200 --check downstream fit          # a quick look
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

from megatron_ext.runtime.errors import StudyError, exits_on_error
from megatron_ext.runtime.files import write_text
from megatron_ext.study.calibration import suite


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=2000,
                        help="simulated trials per scenario; the band each rate must lie "
                             "in widens below 2000 (default 2000)")
    parser.add_argument("--seed", type=int, default=0, help="the simulations' seed")
    parser.add_argument("--check", nargs="+", metavar="CHECK",
                        choices=sorted({c for c, *_ in suite.SCENARIOS}),
                        help="only these checks (default: all)")
    parser.add_argument("--output-dir", type=Path,
                        help="write calibration.json and calibration.md there")
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> dict:
    with exits_on_error():
        args = parse_args(argv)
        if args.trials < 1:
            raise StudyError(f"--trials must be at least 1, got {args.trials}")
        start = time.monotonic()
        result = suite.run(args.trials, args.seed, args.check)
        result["generated"] = {
            # an absolute path of this machine is shown by its last part only
            "command": "python tools/calibrate.py " + shlex.join(
                a if not os.path.isabs(a) else Path(a).name for a in (argv or sys.argv[1:])),
            "time": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
            "seconds": round(time.monotonic() - start, 1)}
        g = result["generated"]
        text = "\n".join([f"`{g['command']}` ({g['time']}, {g['machine']}, {g['seconds']} s):",
                          ""] + suite.markdown(result)) + "\n"
        print(text, end="")
        if args.output_dir:
            args.output_dir.mkdir(parents=True, exist_ok=True)
            write_text(args.output_dir / "calibration.json", json.dumps(result, indent=1) + "\n")
            write_text(args.output_dir / "calibration.md", text)
        outside = [f"{r['check']} / {r['scenario']} / {r['interval']}: {r['rate']:.3f}"
                   for r in result["rows"] if r["within"] is False]
        if outside:
            raise StudyError("outside their band: " + "; ".join(outside))
        return result


if __name__ == "__main__":
    main(sys.argv[1:])
