#!/usr/bin/env python3
"""Puts dxdp's configuration-file schema into the chart's values.schema.json.

The chart's `config` value is dxdp's configuration file, so its schema is the one the binary
generates (`dxdp config schema`), never a hand-kept copy. Run after changing the configuration
types (tests/cli/schemas.rs fails until the two agree):

    cargo run -q -- config schema | python3 deploy/sync_config_schema.py
"""

import json
import pathlib
import sys

VALUES_SCHEMA = pathlib.Path(__file__).parent / "helm" / "dxdp" / "values.schema.json"


def main() -> int:
    generated = json.load(sys.stdin)
    generated.pop("title", None)
    doc = json.loads(VALUES_SCHEMA.read_text(encoding="utf-8"))
    doc["properties"]["config"] = generated
    VALUES_SCHEMA.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"updated properties.config in {VALUES_SCHEMA}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
