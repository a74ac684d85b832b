"""Errors a user can act on. The CLI prints them as one line and exits with code 2."""


class QueuectlError(Exception):
    """Base class: something queuectl refuses or cannot do, with a message a user can act on."""


class UsageError(QueuectlError):
    """Bad input (a name, an option, a URL): nothing was changed."""


class NotInstalledError(QueuectlError):
    """The queue (or the catalog) is not installed in this database."""


class ConnectionFailed(QueuectlError):
    """The database could not be reached; the message never contains a password."""


class PayloadTooLarge(UsageError):
    """The server refused an enqueue: a message is over the queue's max_payload_bytes.

    The limit counts payload + title + headers as stored (reliable_0010; the payload only
    before), and the message names the three sizes. Nothing of the call was stored (with
    enqueue_many, not even the other messages).
    """


class StatementCanceled(QueuectlError):
    """The server canceled a statement (statement_timeout, lock_timeout, a cancel request).

    The statement rolled back whole: nothing it would have changed was changed, so sending
    it again is safe. The client does not resend it by itself: whatever made it slow
    (a lock, a tight timeout) is still there, and the caller decides how long to wait.
    """
