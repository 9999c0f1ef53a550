"""Alembic environment of the study store.

`Store.migrate()` hands in an open connection (`config.attributes["connection"]`); the `alembic`
command line instead connects to `PTCTL_DATABASE_URL` (default: SQLite in the data directory).
"""

from alembic import context
from sqlalchemy import Connection, create_engine

from service.settings import Settings
from service.store import Base

target_metadata = Base.metadata


def run(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=target_metadata,
                      render_as_batch=connection.dialect.name == "sqlite")  # SQLite alters tables by copy
    with context.begin_transaction():
        context.run_migrations()


connection = context.config.attributes.get("connection")
if connection is not None:
    run(connection)
else:
    with create_engine(Settings().db_url).connect() as conn:
        run(conn)
