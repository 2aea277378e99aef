"""Command line: `python -m prototype {compare,plot,serve,demo,calibrate,figures}`."""

from __future__ import annotations

import sys

from .cli import calibrate, compare, demo, figures, plot, serve
from .cli.common import Parser, run_command


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m prototype", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    serve.add_arguments(commands.add_parser("serve", help="serve the Responses API (HTTP and WebSocket) on one port"))
    compare.add_arguments(commands.add_parser("compare", help="the main job: all designs side by side at 65, 1000 and 4000 tokens/s"))
    plot.add_arguments(commands.add_parser("plot", help="compare's table and figure again from results folders (one, or several merged), "
                                                        "without running anything"))
    demo.add_arguments(commands.add_parser("demo", help="run one rollout per design under virtual time and print its timeline"))
    calibrate.add_arguments(commands.add_parser("calibrate", help="a trace's distributions and latency fit beside the testbed's defaults"))
    figures.add_arguments(commands.add_parser("figures", help="regenerate the committed figures in docs/figures/ (README, docs/notebooks.md)"))
    args = parser.parse_args(argv)
    runs = {"serve": serve.run, "demo": demo.run, "compare": compare.run, "plot": plot.run, "calibrate": calibrate.run,
            "figures": figures.run}
    return run_command(f"python -m prototype {args.command}", lambda: runs[args.command](args))


if __name__ == "__main__":
    sys.exit(main())
