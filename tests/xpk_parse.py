"""Parses `xpk workload ...` command lines with xpk's own argument parser and prints, for
each, what it parsed (or the error xpk would stop with), as one JSON list. Runs in
.venv-xpk (scripts/setup.sh), apart from the project's environment:

    .venv-xpk/bin/python tests/xpk_parse.py '[["xpk", "workload", "create", ...], ...]'
"""

import argparse
import contextlib
import io
import json
import sys

from xpk.parser.workload import set_workload_create_parser, set_workload_list_parser


def parse(argv: list[str]) -> dict:
    if argv[:2] != ["xpk", "workload"]:
        return {"error": f"not an xpk workload command: {argv[:3]}"}
    parser = argparse.ArgumentParser(prog="xpk workload")
    verbs = parser.add_subparsers(dest="verb", required=True)
    set_workload_create_parser(verbs.add_parser("create"))
    set_workload_list_parser(verbs.add_parser("list"))
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            parsed = parser.parse_args(argv[2:])
    except SystemExit:
        return {"error": stderr.getvalue().strip().splitlines()[-1]}
    return {k: v for k, v in vars(parsed).items() if isinstance(v, (str, int, bool, type(None)))}


print(json.dumps([parse(argv) for argv in json.loads(sys.argv[1])]))
