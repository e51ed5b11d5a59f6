"""The results store: SQLAlchemy models, Alembic migrations and the `Store` API."""

from .common import StoreError
from .store import Store, fingerprint_hash

__all__ = ["Store", "StoreError", "fingerprint_hash"]
