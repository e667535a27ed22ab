"""Writes params.schema.json, the JSON Schema of params.yaml, from stages/lib/params.py.

    python -m tools.schema            # rewrite params.schema.json
    python -m tools.schema --check    # exit 1 if the committed file is out of date

Editors with a YAML language server complete and check params.yaml
against it: VS Code's YAML extension through .vscode/settings.json; elsewhere, point
yaml-language-server's `yaml.schemas` at params.schema.json.
"""

import argparse
import json

from stages.lib import outputs
from stages.lib.cli import run
from stages.lib.params import json_schema
from stages.shared.errors import UserError

SCHEMA_FILE = "params.schema.json"


def rendered() -> str:
    return json.dumps(json_schema(), indent=2, sort_keys=True) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.schema", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help=f"only say whether {SCHEMA_FILE} is up to date")
    if parser.parse_args().check:
        with open(SCHEMA_FILE) as f:
            if f.read() != rendered():
                raise UserError(f"{SCHEMA_FILE} is out of date with stages/lib/params.py; run: python -m tools.schema")
        print(f"{SCHEMA_FILE}: up to date")
        return
    outputs.write_text(SCHEMA_FILE, rendered())
    print(f"wrote {SCHEMA_FILE}")


if __name__ == "__main__":
    run(main, "schema")
