"""The requirements pyproject.toml declares for some extras, one a line, for `pip install -r`.

    python requirements.py pyproject.toml web            # the dependencies, then the web extra's
    python requirements.py pyproject.toml --only torch worker

The images install these before they copy the code, so that layer is rebuilt
only when pyproject.toml changes; the project itself then goes in with --no-deps.
"""

from __future__ import annotations

import argparse
import re
import tomllib


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pyproject")
    parser.add_argument("extras", nargs="*")
    parser.add_argument("--only", action="append", default=[], metavar="NAME",
                        help="just these distributions (by name)")
    args = parser.parse_intermixed_args()
    with open(args.pyproject, "rb") as file:
        project = tomllib.load(file)["project"]
    found = list(project.get("dependencies", []))
    for extra in args.extras:
        found += project["optional-dependencies"][extra]
    if args.only:
        wanted = {name.lower() for name in args.only}
        found = [r for r in found if re.split(r"[\s\[<>=!~;]", r, maxsplit=1)[0].lower() in wanted]
        if not found:
            raise SystemExit(f"{args.pyproject}: no requirement for {', '.join(args.only)}")
    print("\n".join(dict.fromkeys(found)))


if __name__ == "__main__":
    main()
