"""Static catalogs gpuhealth consults when it judges a GPU."""

from gpuhealth.catalog.xid import (
    XidEntry,
    all_entries,
    default_action,
    describe,
    is_application_error,
    lookup,
)

__all__ = [
    "XidEntry",
    "all_entries",
    "default_action",
    "describe",
    "is_application_error",
    "lookup",
]
