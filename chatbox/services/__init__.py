"""Where the services are built: for a serving process (`server.py`, the one place the
appliance is wired) and for the command line on the database alone (`commandline.py`)."""

from chatbox.settings import Settings
from chatbox.store.marker import StoreElsewhere, check_store
from chatbox.store.outage import RETRY_AFTER_S as STORE_RETRY_AFTER_S
from chatbox.store.outage import unreachable as store_unreachable

__all__ = ["STORE_RETRY_AFTER_S", "StoreElsewhere", "check_store_of", "store_unreachable"]


def check_store_of(settings: Settings) -> None:
    """Raise StoreElsewhere where the data directory's store is in PostgreSQL and the
    settings would open (and so create) a SQLite one there."""
    check_store(settings.store_marker_path, settings.database)
