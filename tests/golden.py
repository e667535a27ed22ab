"""A recipe's golden loss curve: the first steps' training loss at the committed seed, as
recorded in tests/data/golden/<recipe>-loss.json (tiny: the random tiny model; small: the real
Gemma 3 270M), and the comparison against it.

    python tests/golden.py WORKSPACE [RECIPE]   # re-record RECIPE's (default tiny) from
                                                # WORKSPACE's DVCLive loss file, after an
                                                # intended change to training (say so in the commit)

A MaxText or Tunix upgrade, a changed flag, learning rate or data order moves these losses;
float noise between machines does not move them past the tolerance (how it was measured is
in the file).
"""

import json
import sys
from pathlib import Path

from testkit.workspace import train_losses

GOLDEN_DIR = Path(__file__).parent / "data" / "golden"


def golden_file(recipe: str = "tiny") -> Path:
    return GOLDEN_DIR / f"{recipe}-loss.json"


def losses(workspace: Path) -> dict[int, float]:
    return {step: float(loss) for step, loss in train_losses(workspace).items()}


def mismatches(logged: dict[int, float], recipe: str = "tiny") -> list[str]:
    """The steps whose loss is not the recipe's golden one, within its tolerance (empty: it matches)."""
    golden = json.loads(golden_file(recipe).read_text())
    out = []
    for step, expected in golden["loss"].items():
        got = logged.get(int(step))
        if got is None or abs(got - expected) > golden["atol"] + golden["rtol"] * abs(expected):
            out.append(f"step {step}: loss {got} vs golden {expected}")
    return out


if __name__ == "__main__":
    logged = losses(Path(sys.argv[1]))
    path = golden_file(sys.argv[2] if len(sys.argv) > 2 else "tiny")
    golden = json.loads(path.read_text())
    golden["loss"] = {str(s): logged[s] for s in range(1, golden["steps"] + 1)}
    path.write_text(json.dumps(golden, indent=2) + "\n")
    print(f"recorded steps 1-{golden['steps']} into {path}")
