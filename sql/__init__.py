"""The results store: SQLAlchemy models, Alembic migrations and the `Store` API."""

from .common import StoreError, StoreUnavailable
from .store import Store

__all__ = ["Store", "StoreError", "StoreUnavailable"]
