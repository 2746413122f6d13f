"""`python -m blocktable.properties.mutation_worker PAYLOAD`: the fuzz engine on a
mutated copy of the package, its messages printed as JSON lines."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main() -> None:
    payload = json.loads(sys.argv[1])
    import blocktable

    root = Path(payload["expect_root"]).resolve()
    if root not in Path(blocktable.__file__).resolve().parents:
        raise SystemExit(f"mutation worker imported {blocktable.__file__}, not the mutated tree under {root}")
    from blocktable.properties.engine import fuzz_child

    def send(message: dict) -> None:
        print(json.dumps(message, default=str), flush=True)

    fuzz_child(payload, send)


if __name__ == "__main__":
    main()
