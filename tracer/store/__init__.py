"""Where finished records are kept: the in-process ring (`memory`), an SQLite file (the
default) or a PostgreSQL database a fleet shares (docs/architecture.md, "The store")."""
