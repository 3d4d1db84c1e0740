"""Prints the exact versions of what `pip install .` puts in the container image: azqueue's
runtime requirements and theirs, as installed in this environment. The image installs
with them as constraints (deploy/constraints.txt), so a rebuild gets what was tested.

    .venv/bin/python scripts/image_constraints.py > deploy/constraints.txt
"""

from __future__ import annotations

import re
from importlib import metadata


def _name(requirement: str) -> str:
    return re.split(r"[\s;<>=!~\[(]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def closure(root: str) -> dict[str, str]:
    found: dict[str, str] = {}
    todo = [root]
    while todo:
        dist = metadata.distribution(todo.pop())
        for requirement in dist.requires or []:
            if "extra ==" in requirement:
                continue
            name = _name(requirement)
            if name not in found:
                found[name] = metadata.version(name)
                todo.append(name)
    return found


if __name__ == "__main__":
    print("# The versions the image installs (scripts/image_constraints.py made this file).")
    for name, version in sorted(closure("azqueue").items()):
        print(f"{name}=={version}")
