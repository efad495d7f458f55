"""The HTTP API's default limits, apart from the server code so the CLI can show them
in its help without importing a web framework."""

# Big enough for a 100,000-item task of short refs with small data; a client
# with more sends several tasks. Change it with create_api(max_body_bytes=...).
DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
# A 16 MiB body at a slow 1 MiB/s still makes it; a client that needs longer is
# indistinguishable from one holding the connection on purpose.
DEFAULT_REQUEST_DEADLINE_S = 30.0
# Ten seconds is ample for any client's head (a few hundred bytes, at most
# h11's 16 KiB) on a slow link; a client that needs longer is indistinguishable
# from one holding the connection on purpose.
DEFAULT_HEADER_TIMEOUT_S = 10.0
