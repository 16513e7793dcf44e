"""In-process request-path tests: the real gateway app, SQLite files, an injected clock, and
a handler function as the upstream (no ports, no processes): milliseconds per test."""
