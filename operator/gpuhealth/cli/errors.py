"""The two ways a command fails, each with its exit code (0 is success)."""

from __future__ import annotations

EXIT_OK = 0
EXIT_API = 1
EXIT_USAGE = 2


class CliError(Exception):
    """A failure reported as one line on stderr."""

    exit_code = EXIT_API


class ApiError(CliError):
    """The API server (or the credentials to reach it) failed: exit 1. ``status``: the HTTP status, if any."""

    exit_code = EXIT_API

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class Refused(CliError):
    """Bad usage, or a change the plugin refuses to make as asked: exit 2."""

    exit_code = EXIT_USAGE
