"""SQL text per engine, loaded by queuectl.sqlfiles."""
