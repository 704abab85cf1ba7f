"""A TCP forwarder on loopback: the stand-in for `kubectl port-forward` in front
of a cluster's dashboard (the launching side reaches that one port only)."""

import contextlib
import socket
import threading
from collections.abc import Callable, Iterator


def _pipe(
    src: socket.socket, dst: socket.socket, cut: Callable[[bytes], bool] | None = None
) -> None:
    seen = b""
    try:
        while data := src.recv(1 << 16):
            if cut is not None:
                seen = (seen + data)[-(1 << 16) :]
                if cut(seen):  # as a network that drops this connection
                    for sock in (src, dst):
                        with contextlib.suppress(OSError):
                            sock.shutdown(socket.SHUT_RDWR)
                    return
            dst.sendall(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


@contextlib.contextmanager
def port_forward(
    target_port: int,
    listen_port: int = 0,
    *,
    connect: Callable[[], socket.socket] | None = None,
    cut: Callable[[bytes], bool] | None = None,
) -> Iterator[int]:
    """Forward a loopback port (`listen_port`, or a new one) to
    127.0.0.1:`target_port`, or to what `connect` opens (e.g. a socket in
    another network namespace); yields the port. A connection whose request
    bytes so far make `cut` true is cut before they go on. On exit every
    connection through it is cut, as when `kubectl port-forward` ends."""
    if connect is None:
        connect = lambda: socket.create_connection(("127.0.0.1", target_port))  # noqa: E731
    listener = socket.create_server(("127.0.0.1", listen_port))
    stop = threading.Event()
    conns: list[socket.socket] = []

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = connect()
            except OSError:
                conn.close()
                continue
            conns.extend((conn, upstream))
            for a, b, c in ((conn, upstream, cut), (upstream, conn, None)):
                threading.Thread(target=_pipe, args=(a, b, c), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        with contextlib.suppress(OSError):
            listener.shutdown(socket.SHUT_RDWR)  # wakes the accept(): the port is free
        listener.close()
        thread.join(timeout=5)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()
