"""Worker handlers whose errors carry text chosen by whoever enqueued the item."""


def fail_with_payload(message):
    raise ValueError(message.payload.decode("utf-8"))
