"""Errors a user can act on. The CLI prints them as one line and exits with code 2."""


class QueuectlError(Exception):
    """Base class: something queuectl refuses or cannot do, with a message a user can act on."""


class UsageError(QueuectlError):
    """Bad input (a name, an option, a URL): nothing was changed."""


class NotInstalledError(QueuectlError):
    """The queue (or the catalog) is not installed in this database."""


class ConnectionFailed(QueuectlError):
    """The database could not be reached; the message never contains a password."""
