"""Print pip constraints that pin every dependency setup.cfg gives a floor (``name>=X``) to exactly that floor:
the environment ``make test-floor`` proves the declared ranges in."""

import configparser
import re
import sys
from pathlib import Path

SETUP_CFG = Path(__file__).resolve().parents[1] / "setup.cfg"
FLOOR = re.compile(r"^\s*([A-Za-z0-9_.\-]+)\s*>=\s*([0-9][0-9A-Za-z.]*)\s*$")


def floors(setup_cfg: Path = SETUP_CFG) -> dict:
    """{package: floor} for every ``name>=X`` in install_requires and the extras."""
    parser = configparser.ConfigParser()
    parser.read(setup_cfg)
    lines = parser["options"]["install_requires"].splitlines()
    for extra in parser["options.extras_require"].values():
        lines += extra.split(";")
    found = {}
    for line in lines:
        match = FLOOR.match(line)
        if match:
            found[match.group(1).lower()] = match.group(2)
    return found


if __name__ == "__main__":
    sys.stdout.write("".join(f"{name}=={version}\n" for name, version in sorted(floors().items())))
