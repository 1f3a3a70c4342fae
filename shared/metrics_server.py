"""The ``--metrics-port`` endpoint: a service's Prometheus metrics at
``/metrics``, over the same TLS as its gRPC port.

- no TLS settings: plain HTTP;
- ``--tls-cert`` / ``--tls-key``: TLS only (1.2+);
- and ``--tls-client-ca``: mutual TLS, as on the gRPC port: a scrape without
  a client certificate signed by that CA is refused in the handshake.

The TLS context is :meth:`ServerTLS.ssl_context` (the one of the router's
HTTP API). Each connection handshakes on its own thread, with a timeout, so
a client that connects and stays silent holds up no other scrape
(prometheus_client's own TLS server handshakes in its accept loop).
"""
from __future__ import annotations

import socket
import ssl
import threading
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import make_wsgi_app

from dspark.shared.logging import get_logger

log = get_logger(component="metrics")

# Seconds a connection may take for its handshake and then for each read.
CONNECTION_TIMEOUT_S = 10.0


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format, *args) -> None:  # noqa: A002 - the base's name
        pass  # no access log on stderr


class _MetricsHTTPServer(ThreadingMixIn, WSGIServer):
    """One thread per connection; TLS (when ``ssl_context`` is set) is
    negotiated on that thread."""

    daemon_threads = True
    ssl_context: ssl.SSLContext | None = None

    def finish_request(self, request, client_address) -> None:
        request.settimeout(CONNECTION_TIMEOUT_S)
        if self.ssl_context is None:
            return super().finish_request(request, client_address)
        try:
            conn = self.ssl_context.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError) as e:  # e.g. no or an untrusted client certificate
            log.info("metrics_tls_refused", peer=client_address[0],
                     error=getattr(e, "reason", None) or type(e).__name__)
            return
        try:
            super().finish_request(conn, client_address)
        finally:
            conn.close()

    def handle_error(self, request, client_address) -> None:
        log.info("metrics_connection_failed", peer=client_address[0])  # e.g. a read timeout


def _server_class(host: str, port: int) -> type[_MetricsHTTPServer]:
    """The server class with the address family of ``host`` (IPv4 or IPv6)."""
    family = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                flags=socket.AI_PASSIVE)[0][0]
    return type("MetricsHTTPServer", (_MetricsHTTPServer,), {"address_family": family})


def start_metrics_server(metrics, host: str, port: int, *, tls=None) -> "MetricsServer":
    """Serve ``metrics`` (a ``dspark.shared.metrics`` set) at
    http(s)://host:port/metrics on daemon threads. ``tls``: a
    ``dspark.shared.security.ServerTLS`` (mutual when it has a client CA) or
    None. An unusable address or port is an OSError; bad PEM files a
    ValueError naming the field."""
    ctx = tls.ssl_context() if tls is not None else None
    server = make_server(host, port, make_wsgi_app(metrics.registry),
                         server_class=_server_class(host, port), handler_class=_QuietHandler)
    server.ssl_context = ctx
    thread = threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True)
    thread.start()
    return MetricsServer(server, thread)


class MetricsServer:
    """A running metrics HTTP server; :meth:`stop` shuts it down."""

    def __init__(self, server, thread: threading.Thread) -> None:
        self._server, self._thread = server, thread
        self.port = server.server_address[1]

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
