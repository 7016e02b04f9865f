"""`python -m tracer trace <format>`: a window of requests and engine steps exported for other
tools, from a live server's `/ui/api/timeline` or a file holding its answer."""
