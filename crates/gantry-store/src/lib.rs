//! Persistence: every SQL statement, the embedded migrations, SQLite and PostgreSQL.
