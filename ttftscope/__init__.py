"""The `ttftscope` command: one name for the engine's server and the tracer's tools."""
