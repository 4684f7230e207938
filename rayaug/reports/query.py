"""SQL (DuckDB) over a committed output: tables `manifest` and `errors`, view `applied_ops`."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from rayaug.errors import UsageError
from rayaug.outputs import manifests, quarantine
from rayaug.storage import Location

# One row per applied op of every sample: position in its ops list, name, drawn params (JSON).
APPLIED_OPS_VIEW = """
CREATE VIEW applied_ops AS
SELECT m.sample_id, m.source_key, m.view, m.label,
       CAST(o.key AS INTEGER) AS position,
       o.value ->> 'op' AS op,
       o.value -> 'params' AS params
FROM manifest AS m, json_each(m.ops) AS o
"""


# Manifest columns that hold JSON text: typed JSON in SQL, so `->` and `->>` apply directly.
_JSON_COLUMNS = ("ops", "targets")


@dataclass(frozen=True)
class QueryResult:
    columns: list[str]
    rows: list[tuple]
    truncated: bool  # more rows than max_rows were produced


def query(out: Location, sql: str, max_rows: int | None = None) -> QueryResult:
    """Run `sql` with DuckDB over the committed output.

    Tables: `manifest` (the manifest rows; `ops`, `targets` typed JSON), `errors` (the
    quarantine) and the view `applied_ops` (sample_id, source_key, view, label, position, op,
    params JSON).
    A bad query raises UsageError with DuckDB's message on one line.
    """
    import duckdb

    if not sql.strip():
        raise UsageError("empty query")
    # No replacement scans: an unknown table name must not resolve to a Python variable here.
    con = duckdb.connect(config={"python_enable_replacements": False})
    try:
        _register(con, manifests(out), quarantine(out))
        cursor = con.execute(sql)
        if cursor.description is None:  # a statement without a result (SET, CREATE ...)
            return QueryResult([], [], False)
        columns = [d[0] for d in cursor.description]
        rows = cursor.fetchall() if max_rows is None else cursor.fetchmany(max_rows + 1)
    except duckdb.Error as error:
        raise UsageError(f"query failed: {_one_line(str(error))}") from None
    finally:
        con.close()
    truncated = max_rows is not None and len(rows) > max_rows
    return QueryResult(columns, rows[:max_rows] if truncated else rows, truncated)


def _register(con, manifest: pa.Table, errors: pa.Table) -> None:
    con.register("_manifest_arrow", manifest)
    con.register("_errors_arrow", errors)
    as_json = ", ".join(f"{c}::JSON AS {c}" for c in _JSON_COLUMNS if c in manifest.column_names)
    replace = f" REPLACE ({as_json})" if as_json else ""
    con.execute(f"CREATE VIEW manifest AS SELECT *{replace} FROM _manifest_arrow")
    con.execute("CREATE VIEW errors AS SELECT * FROM _errors_arrow")
    con.execute(APPLIED_OPS_VIEW)


def _one_line(message: str) -> str:
    """DuckDB's message without its source excerpt ('LINE 1: ...' and the caret line)."""
    head = message.split("\n\nLINE ", 1)[0]
    return " ".join(line.strip() for line in head.splitlines() if line.strip())
