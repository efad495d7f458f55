"""The HTTP API's default limits, apart from the server code so the CLI can show them
in its help without importing a web framework."""

# Big enough for a 100,000-item task of short refs with small data; a client
# with more sends several tasks. Change it with create_api(max_body_bytes=...).
DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
# A 16 MiB body at a slow 1 MiB/s still makes it; a client that needs longer is
# indistinguishable from one holding the connection on purpose.
DEFAULT_REQUEST_DEADLINE_S = 30.0
# Ten seconds is ample for any client's head (a few hundred bytes, at most
# MAX_HEAD_BYTES) on a slow link; a client that needs longer is indistinguishable
# from one holding the connection on purpose.
DEFAULT_HEADER_TIMEOUT_S = 10.0
# A request head (request line, headers, the blank line) over this is answered
# 431. Browsers and HTTP clients send well under 8 KiB; 16 KiB is h11's own
# bound on a head still incomplete after a read, now applied to whole heads too.
MAX_HEAD_BYTES = 16 * 1024
