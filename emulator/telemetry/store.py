"""The run store: one directory per run, every series on one clock, that pandas and polars open
directly (Parquet, through pyarrow), with a JSON manifest.

    RUN_DIR/manifest.json   the scenario, the topology's text, the time model, versions, the
                            workload's result, and each table's rows
    RUN_DIR/ports.parquet   every switch port at every sample
    RUN_DIR/paths.parquet   the borders' ports onto each long-haul path at every sample
    RUN_DIR/nics.parquet    every sending QP at every sample
    RUN_DIR/events.parquet  each event: when the timeline said, when it was applied, when it
                            took effect, converged, was restored, converged back

Times are wall seconds from the run's start (``t_s``; the manifest's ``t0_monotonic`` is that
start on CLOCK_MONOTONIC) and the real fabric's seconds (``t_real_s``); sizes and rates are the
emulation's (the manifest's time model turns them into the real fabric's).
"""
from __future__ import annotations

import json
from pathlib import Path

FORMAT_VERSION = 1
TABLES = ("ports", "paths", "nics", "events")


def write(run_dir: str | Path, manifest: dict, tables: dict[str, list[dict]]) -> Path:
    """Write the run: each table as Parquet (an empty one keeps its columns from ``manifest``'s
    ``columns``), then the manifest last, so a directory with a manifest is a whole run."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = Path(run_dir)
    out.mkdir(parents=True, exist_ok=True)
    counts = {}
    for name in TABLES:
        rows = tables.get(name, [])
        table = pa.Table.from_pylist(rows) if rows else pa.table({c: [] for c in manifest.get("columns", {}).get(name, [])})
        pq.write_table(table, out / f"{name}.parquet")
        counts[name] = len(rows)
    (out / "manifest.json").write_text(json.dumps({**manifest, "format": FORMAT_VERSION, "rows": counts}, indent=2))
    return out


def read(run_dir: str | Path) -> tuple[dict, dict[str, list[dict]]]:
    """A run's manifest and tables (rows as dicts); a clear error if it is not a whole run."""
    import pyarrow.parquet as pq

    from emulator.errors import UsageError

    d = Path(run_dir)
    manifest_path = d / "manifest.json"
    if not manifest_path.is_file():
        raise UsageError(f"{d}: no manifest.json: not a run directory (backplane run scenario writes them)")
    manifest = json.loads(manifest_path.read_text())
    if manifest.get("format") != FORMAT_VERSION:
        raise UsageError(f"{d}: run format {manifest.get('format')!r}; this backplane reads {FORMAT_VERSION}")
    tables = {}
    for name in TABLES:
        path = d / f"{name}.parquet"
        if not path.is_file():
            raise UsageError(f"{d}: {path.name} is missing: the run is incomplete")
        tables[name] = pq.read_table(path).to_pylist()
    return manifest, tables
