"""Static catalogs gpuhealth consults when it judges a GPU."""

from gpuhealth.catalog.xid import (
    XidEntry,
    action_for_recovery,
    all_entries,
    default_action,
    describe,
    is_application_error,
    lookup,
)

__all__ = [
    "XidEntry",
    "action_for_recovery",
    "all_entries",
    "default_action",
    "describe",
    "is_application_error",
    "lookup",
]
