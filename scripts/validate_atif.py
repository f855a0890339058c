"""Validates ATIF trajectory files with Harbor's own pydantic models.

    python validate_atif.py DIR

Every DIR/*.json must validate as harbor.models.trajectories.Trajectory and declare
ATIF-v1.8. Prints one JSON line ({"validated": n, "failed": [{"file", "error"}]}) and exits
0 when every file (at least one) validated, 1 otherwise, 2 on bad usage.
"""

import json
import pathlib
import sys

from harbor.models.trajectories import Trajectory


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    files = sorted(pathlib.Path(sys.argv[1]).glob("*.json"))
    failed = []
    for path in files:
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
            trajectory = Trajectory.model_validate(doc)
            if trajectory.schema_version != "ATIF-v1.8":
                raise ValueError(f"schema_version is {trajectory.schema_version}")
        except Exception as e:  # every failure is reported, whatever its kind
            failed.append({"file": path.name, "error": str(e)})
    print(json.dumps({"validated": len(files) - len(failed), "failed": failed}))
    return 0 if files and not failed else 1


if __name__ == "__main__":
    sys.exit(main())
