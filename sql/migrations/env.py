"""Alembic environment, driven programmatically by `sql.store.Store.migrate`.

There is no alembic.ini: the store hands over an open connection (inside its transaction)
in `config.attributes["connection"]`, so migrations never see or log the database URL.
"""

from __future__ import annotations

from alembic import context

from sql.models import Base

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run migrations through sql.Store(url).migrate(), not the alembic CLI")

context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    render_as_batch=connection.dialect.name == "sqlite",  # SQLite cannot ALTER most things
    compare_type=True,
)
with context.begin_transaction():
    context.run_migrations()
