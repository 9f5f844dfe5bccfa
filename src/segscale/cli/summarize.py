"""``python -m segscale.cli.summarize <sweep folder>``: the sweep table, after the fact."""

from __future__ import annotations

import argparse
import sys

from segscale.sweeps.sweep_summary import markdown_table, write_sweep_summary


def main(argv: list[str] | None = None) -> int:
    """Write and print the summary of the sweep folder named on the command line."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("sweep_dir", help="a multirun folder, e.g. outputs/train-multirun/<date>")
    args = parser.parse_args(argv)
    try:
        rows = write_sweep_summary(args.sweep_dir)
    except FileNotFoundError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if not rows:
        print(f"error: {args.sweep_dir} holds no job folders (0/, 1/, ...)", file=sys.stderr)
        return 2
    print(markdown_table(rows), end="")
    print(f"written: {args.sweep_dir}/sweep_summary.csv, .md and sweep_curves.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
