"""Reports over a committed output, one module each: `summary` (summary and verification),
`sheet` (contact sheet), `query` (DuckDB SQL), `stats` (statistics and their plot)."""
