"""``segack ui``: a page for one checkpoint, served while a run goes on or after it.

The page (``/``) is a template and a script shipped with the package; the script asks ``/api/state``
every few seconds and redraws, so the page follows the run without reloading. ``/metrics`` serves
the checkpoint's Prometheus metrics (:mod:`~segack.spark_adapter.console.metrics`). Every request
reads the checkpoint as ``segack status`` does and writes nothing, except the page's controls
(:mod:`~segack.spark_adapter.console.controls`).

Who may ask: on a loopback address with no token, requests whose ``Host`` names this machine (so
that another site's page cannot reach it through a name of its own); with a token (needed to listen
on any other address, and for controls), requests that carry it as ``Authorization: Bearer TOKEN``.
The page's own address holds the token in its fragment (``#token=``), which no request carries: the
script keeps it in the tab's ``sessionStorage`` (which no page of another port or site reads) and
sends it with each request. A cookie would not do: a browser sends a host's cookies to every one of
its ports, so any server on this machine the browser visits would get it. The page's shell and its
script hold nothing of the checkpoint and need no token; its state, its metrics and its controls do.
A control must also carry the page's CSRF token, made for each server and given with the state;
``read_only`` serves no controls and refuses their POSTs.

Flask makes the pages; the standard library's WSGI server serves them, a thread a request, as
prometheus_client serves its metrics: an operator's console for one checkpoint, not a public web
site.
"""

from __future__ import annotations

import ipaddress
import logging
import re
import secrets
import socket
import threading
from socketserver import ThreadingMixIn
from typing import TYPE_CHECKING, Any
from urllib.parse import quote
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from flask import Flask, Response, abort, jsonify, make_response, redirect, render_template, request
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import CollectorRegistry

from segack.kernel import Segment, SegmentSet
from segack.spark_adapter.console.controls import controls, same_secret
from segack.spark_adapter.console.metrics import CheckpointCollector
from segack.spark_adapter.console.snapshot import SegmentView, Snapshot, dead_letter_keys
from segack.spark_adapter.errors import OptionError
from segack.spark_adapter.results import holding_back
from segack.spark_adapter.store import rescale
from segack.spark_adapter.store.checkpoint import CheckpointError, CheckpointStore

if TYPE_CHECKING:
    from werkzeug.wrappers import Response as BaseResponse

__all__ = ["DEFAULT_PORT", "PageServer", "create_app", "page_state", "serve_page"]

log = logging.getLogger(__name__)

#: ``segack ui``'s port unless ``--port`` says otherwise.
DEFAULT_PORT = 8642
#: An ``Authorization`` header's bearer token.
#: What the page may do: be framed nowhere, run its own script alone, ask its own server alone.
CONTENT_SECURITY_POLICY = ("frame-ancestors 'none'; script-src 'self'; connect-src 'self'; base-uri 'none'; "
                           "form-action 'self'")
# Blanks are spaces and tabs only: a header is read as Latin-1, where a non-ASCII token's last UTF-8
# byte may be one that Unicode calls a space (A0, 85).
_BEARER = re.compile(r"[ \t]*bearer[ \t]+(.+?)[ \t]*", re.IGNORECASE)
#: Dead-letter keys the page lists at most (``segack dead-letters --top`` shows more).
DEAD_LETTER_KEYS = 200
#: Segment sets the page draws (the newest); it lists the others.
HISTORY_DRAWN = 12


def is_loopback(host: str) -> bool:
    """Whether ``host`` is an address of this machine only (``localhost`` counts)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _mergeable(view: SegmentView, live: set[tuple[int, int]]) -> bool:
    """Whether the page offers to merge ``view``: its sibling is live (not the root, not split further)."""
    return view.mask != 0 and (Segment(view.segment_id, view.mask).mergeable_segment_id(), view.mask) in live


def hash_space_layout(ids: list[int]) -> list[tuple[int, float, float]]:
    """Where each segment of the set ``ids`` lies when the hash space is drawn as its tree of
    splits: ``(id, start, share)``, start and share as fractions of the whole.

    A segment of mask ``2**w - 1`` holds the hashes whose low ``w`` bits are its id; reading those
    bits backwards places it, so that a split divides its block in two, side by side, and a merge
    joins two neighbours."""
    layout = []
    for member in SegmentSet.from_ids(ids):
        width = member.mask.bit_length()
        backwards = int(f"{member.segment_id:0{width}b}"[::-1], 2) if width else 0
        layout.append((member.segment_id, backwards / 2 ** width, 1 / 2 ** width))
    return sorted(layout, key=lambda placed: placed[1])


def _history(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The segment sets, oldest first; the last :data:`HISTORY_DRAWN` with their layout."""
    first_drawn = len(history) - HISTORY_DRAWN
    return [{"at": entry["at"], "segments": len(entry["segments"]), "why": entry["why"],
             "layout": hash_space_layout(entry["segments"]) if index >= first_drawn else None}
            for index, entry in enumerate(history)]


def _hottest_key_group(snapshot: Snapshot) -> dict[str, Any] | None:
    """The key group with most events and its share of them, once the input is counted: a
    segment holds whole key groups, so no set of segments makes one segment's share smaller."""
    tokens = snapshot.state.tokens
    if tokens is None or not tokens.counted or not tokens.total:
        return None
    group = int(tokens.count.argmax())
    return {"key_group": group, "events": int(tokens.count[group]),
            "share": float(tokens.count[group]) / tokens.total}


def _requested(store: CheckpointStore) -> dict[str, Any] | None:
    """The change of segments asked of the live run and not applied yet, as ``segack status`` says."""
    try:
        change = rescale.pending_change(store)
    except CheckpointError as error:
        return {"why": str(error), "segments": None, "requested_at": None, "by": None}
    return None if change is None else {"why": change.why, "segments": len(change.segments),
                                        "requested_at": change.requested_at, "by": change.by}


def _real_time(snapshot: Snapshot) -> dict[str, Any]:
    """A real-time stream's partitions as the page draws a stream's, each with its records pending,
    and while a run is live the one that holds it back
    (:func:`~segack.spark_adapter.results.holding_back`) marked."""
    settings = snapshot.state.settings
    group = settings.get("commit_offsets_to")
    busiest = holding_back(snapshot.partitions) if snapshot.live else None
    return {"real_time": True, "commit_interval": settings.get("commit_interval"), "group": group,
            "completed_batch": -1, "last_batch": None, "in_progress": None, "ends_at": None,
            "partitions": [{"topic": partition.topic or settings.get("topic"),
                            "partition": partition.partition,
                            "next_offset": partition.next_offset,
                            "committed": partition.next_offset if group else None,
                            "end_offset": partition.end, "lag": partition.lag, "pending": partition.pending,
                            "holds_back": partition is busiest}
                           for partition in snapshot.partitions]}


def page_state(store: CheckpointStore) -> dict[str, Any]:
    """What ``/api/state`` answers: the checkpoint now, as the page draws it (JSON-able)."""
    snapshot = Snapshot.read(store)
    if snapshot is None:
        return {"checkpoint": store.location, "exists": False}
    settings, claim = snapshot.state.settings, snapshot.claim
    total_letters, letters = dead_letter_keys(store, str(settings.get("key", "")))
    segments = snapshot.segments()
    live = {(view.segment_id, view.mask) for view in segments}
    stream = snapshot.stream
    committed = {(str(topic), int(partition)): int(end)
                 for topic, partition, end in (stream or {}).get("group_offsets", [])}
    return {
        "checkpoint": store.location, "exists": True, "at": snapshot.at,
        "kind": snapshot.kind, "state": snapshot.condition,
        "claim": None if claim is None else {
            "number": claim.number, "owner": claim.owner(), "live": snapshot.live,
            "claimed_at": claim.claimed_at, "extended_at": claim.extended_at, "timeout": claim.timeout,
            "released": claim.released},
        "started_at": settings.get("started_at"), "updated_at": settings.get("updated_at"),
        "key": settings.get("key"), "order": settings.get("order"), "source": settings.get("source"),
        "events": {"done": snapshot.events_done, "dead_letters": snapshot.dead_letters,
                   "handled": max(snapshot.events_done - snapshot.dead_letters, 0),
                   "total": snapshot.input_events, "in_flight": snapshot.in_flight,
                   "pending": snapshot.pending, "retries": snapshot.retries},
        "segments": [dict(vars(view), mergeable=_mergeable(view, live)) for view in segments],
        "requested": _requested(store),
        "strips": snapshot.segment_strips(),
        "key_group_bits": None if snapshot.state.tokens is None else snapshot.state.tokens.bits,
        "history": _history(settings.get("segment_history", [])),
        "hottest_key_group": _hottest_key_group(snapshot),
        "stream": _real_time(snapshot) if snapshot.real_time else None if not stream else {
            "completed_batch": stream.get("completed_batch", -1), "last_batch": stream.get("last_batch"),
            "in_progress": (stream.get("batch") or {}).get("id"), "group": stream.get("commit_offsets_to"),
            "ends_at": stream.get("ends_at"),
            "partitions": [{"topic": topic, "partition": partition, "next_offset": end,
                            "committed": committed.get((topic, partition)), "end_offset": latest,
                            "lag": None if latest is None else max(latest - end, 0)}
                           for topic, partition, end, latest in stream.get("partitions") or []]},
        "dead_letters": {"events": total_letters, "keys": len(letters),
                         "shown": [{"key": str(letter.key), "events": letter.events, "error": letter.error,
                                    "attempts": letter.attempts} for letter in letters[:DEAD_LETTER_KEYS]]},
    }


def create_app(store: CheckpointStore, token: str | None = None, read_only: bool = False) -> Flask:
    """The page's Flask application for ``store``: with ``token``, every request but the page's shell
    and script must carry it as ``Authorization: Bearer TOKEN``; without (a read-only page), only
    requests whose ``Host`` is this machine are answered. ``read_only``: no controls. No page of
    another site may frame it."""
    if token is None and not read_only:
        raise OptionError("a page with controls needs a token")
    app = Flask(__name__)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(CheckpointCollector(store))
    csrf = None if read_only else secrets.token_urlsafe(24)

    @app.before_request
    def allowed() -> BaseResponse | None:
        if token is None:
            host = (request.host or "").rsplit(":", 1)[0].strip("[]")
            if not is_loopback(host):
                abort(403, f"segack ui answers requests to this machine only, not to host {host!r}")
            return None
        if same_secret(request.args.get("token"), token):
            # An address as earlier releases printed it: the token moves to the fragment.
            return redirect(f"{request.path}#token={quote(token, safe='')}")
        if request.method == "GET" and (request.path == "/" or request.path.startswith("/static/")):
            return None
        bearer = _BEARER.fullmatch(request.headers.get("Authorization", ""))
        if not (bearer is not None and same_secret(bearer.group(1), token, header=True)):
            abort(401, "segack ui needs its token: open the page's address with it after #token= (as it "
                       "printed it, or percent-encoded), or send Authorization: Bearer TOKEN")
        return None

    @app.after_request
    def framed_nowhere(response: Response) -> Response:
        # A page elsewhere that frames this one could have its buttons pressed through its own.
        response.headers["X-Frame-Options"] = "DENY"
        response.headers["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
        response.headers["Referrer-Policy"] = "no-referrer"
        return response

    @app.errorhandler(400)
    @app.errorhandler(401)
    @app.errorhandler(403)
    @app.errorhandler(404)
    @app.errorhandler(405)
    @app.errorhandler(409)
    def refused(error: Any) -> Response:
        return make_response(f"{error.description}\n", error.code,
                             {"Content-Type": "text/plain; charset=utf-8"})

    @app.get("/")
    def page() -> str:
        return render_template("page.html", controls=csrf is not None)

    @app.get("/api/state")
    def state() -> Response:
        return jsonify({**page_state(store), **({"csrf": csrf} if csrf is not None else {})})

    @app.get("/metrics")
    def metrics() -> Response:
        return Response(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)

    app.register_blueprint(controls(store, csrf))
    return app


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _ThreadingServer6(_ThreadingServer):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """No line per request."""


class PageServer:
    """The page served on ``host:port`` on its own thread until :meth:`close`."""

    def __init__(self, store: CheckpointStore, host: str, port: int, token: str | None,
                 read_only: bool = False) -> None:
        server_class = _ThreadingServer6 if ":" in host else _ThreadingServer
        try:
            self._server = make_server(host, port, create_app(store, token, read_only),
                                       server_class=server_class, handler_class=_QuietHandler)
        except OSError as error:
            raise OptionError(f"cannot serve the page on {host}:{port}: {error.strerror or error}") from None
        self.host, self.token = host, token
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, name="segack-ui", daemon=True)
        self._thread.start()

    @property
    def address(self) -> str:
        """The page's address (this machine's name when it listens on every address)."""
        host = socket.gethostname() if self.host in ("0.0.0.0", "::") else self.host
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}/"

    @property
    def url(self) -> str:
        """The page's :attr:`address`, with its token if it has one: what to open."""
        return self.address + (f"#token={quote(self.token, safe='')}" if self.token else "")

    def close(self) -> None:
        """Stop serving and free the port."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def __enter__(self) -> PageServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def serve_page(checkpoint: str | CheckpointStore, host: str = "127.0.0.1", port: int = DEFAULT_PORT,
               token: str | None = None, read_only: bool = False) -> PageServer:
    """Serve the page of ``checkpoint`` on ``http://HOST:PORT/`` until the returned server is
    closed.

    Parameters
    ----------
    checkpoint : str or CheckpointStore
        Any checkpoint location segack reads, with a run under way or not.
    host : str, default ``'127.0.0.1'``
        The address to listen on.
    port : int, default :data:`DEFAULT_PORT`
        0 picks a free one (``server.port``).
    token : str, optional
        What every request but the page's shell must carry, as an ``Authorization: Bearer``
        header: the page's script sends the one in its address's fragment (``#token=``), and a
        Prometheus scrape sends it so. A page with controls
        always has one, and so does one on any address but loopback: when none is given, one is
        made (``server.url`` carries it). Only a read-only page on loopback may go without.
    read_only : bool, default ``False``
        Serve no controls (split, merge, scale, release), and refuse their POSTs with a 403.

    Raises
    ------
    OptionError
        A port outside 0..65535, an empty token, or an address that cannot be listened on.
    """
    store = checkpoint if isinstance(checkpoint, CheckpointStore) else CheckpointStore(checkpoint)
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise OptionError(f"port must be an int in 0..65535, not {port!r}")
    if token is not None and not token:
        raise OptionError("token must not be empty")
    if token is None and not (read_only and is_loopback(host)):
        # Any process of this machine may read a page on loopback, and with it its CSRF token: the
        # controls need what only the one who started the page was told.
        token = secrets.token_urlsafe(24)
    return PageServer(store, host, port, token, read_only)
