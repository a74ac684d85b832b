"""PgQueuer and Procrastinate beside queuectl: scenario `peers`."""
