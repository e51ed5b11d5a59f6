"""The results store: SQLAlchemy models, Alembic migrations and the `Store` API."""

from .common import StoreError
from .store import Store

__all__ = ["Store", "StoreError"]
