"""The page's controls: what ``segack split``, ``merge``, ``scale`` and ``release --force`` do, asked
by a ``POST`` to ``/api/split``, ``/api/merge``, ``/api/scale`` or ``/api/release``.

A page with controls always has a token (:func:`~segack.spark_adapter.console.page.serve_page`):
a request reaches them only from whoever was told it. Each control:

1. is refused (403) on a read-only page, which has no CSRF token;
2. must carry the page's CSRF token in the :data:`CSRF_HEADER` header (403 without it): the token is
   made for each server and given with the page's state, which another site's page can neither read
   nor send, so a link or a form elsewhere cannot press a button;
3. takes a JSON object (400 otherwise: a form cannot send one across sites either);
4. does what its command does, through the same function
   (:mod:`~segack.spark_adapter.store.rescale`, :func:`~segack.spark_adapter.store.claims.force_release`),
   and answers its one line; a change the rules refuse answers 409, a request that is not one
   answers 400, each with its reason, and neither writes anything. A release of a claim whose run
   is live (which stops that run) needs ``"force": true`` too (409 without it).
"""

from __future__ import annotations

import hmac
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from flask import Blueprint, Response, abort, make_response, request

from segack.spark_adapter.errors import OptionError, SegmentChangeError
from segack.spark_adapter.store import rescale
from segack.spark_adapter.store.checkpoint import CheckpointError, CheckpointStore
from segack.spark_adapter.store.claims import force_release, latest_claim

__all__ = ["CSRF_HEADER", "controls", "same_secret"]

log = logging.getLogger(__name__)

#: The request header a control's CSRF token comes in.
CSRF_HEADER = "X-Segack-CSRF"


def same_secret(given: str | None, secret: str, *, header: bool = False) -> bool:
    """Whether ``given`` is ``secret``, compared in constant time as bytes: any text is compared, not
    only ASCII (a header's value comes decoded as Latin-1, and is compared as the bytes sent)."""
    if given is None:
        return False
    if not header:
        return hmac.compare_digest(given.encode("utf-8", "replace"), secret.encode())
    # The server strips what Unicode calls blanks around a header's value (Latin-1 A0 and 85 too),
    # which a non-ASCII secret's UTF-8 bytes may end with: both are compared so stripped.
    sent = secret.encode().decode("latin-1").strip().encode("latin-1")
    return hmac.compare_digest(given.strip().encode("latin-1", "replace"), sent)


def _field(body: dict[str, Any], name: str) -> Any:
    """``body[name]``, or ``None``: the function it goes to refuses what is not what it takes."""
    return body.get(name)


def _release(store: CheckpointStore, body: dict[str, Any]) -> str:
    number, force = _field(body, "claim"), _field(body, "force")
    if isinstance(number, bool) or not isinstance(number, int):
        raise OptionError(f"release needs the number of the claim to release, not {number!r}")
    if force not in (None, True, False):
        raise OptionError(f"release's force is true or false, not {force!r}")
    claim = latest_claim(store)
    if claim is not None and claim.number == number and claim.live(time.time()) and not force:
        # Releasing a live claim stops its run (it is fenced): the page asks its user first.
        raise CheckpointError(f"claim {number} is held by {claim.owner()}, which is live: releasing it "
                              f"stops that run; send force: true to release it anyway")
    released = force_release(store, f"segack ui (pid {os.getpid()}) for {request.remote_addr}", number)
    if released is None:
        return f"claim {number} is released already; nothing to do"
    return f"released the claim of {released.owner()}; should it come back, it is fenced"


def controls(store: CheckpointStore, csrf: str | None) -> Blueprint:
    """The controls' routes for ``store``; with ``csrf`` ``None`` (a read-only page), each answers 403."""
    actions: dict[str, Callable[[dict[str, Any]], str]] = {
        "split": lambda body: rescale.split(store, _field(body, "segment_id")).describe(),
        "merge": lambda body: rescale.merge(store, _field(body, "segment_id")).describe(),
        "scale": lambda body: rescale.scale(store, _field(body, "segments"),
                                            workers=_field(body, "workers")).describe(),
        "release": lambda body: _release(store, body),
    }
    blueprint = Blueprint("controls", __name__)

    @blueprint.post("/api/<any(split, merge, scale, release):name>")
    def control(name: str) -> Response:
        # 1-3: who may ask, and how.
        if csrf is None:
            abort(403, "this page is read-only (segack ui --read-only): it changes nothing")
        if not same_secret(request.headers.get(CSRF_HEADER), csrf, header=True):
            abort(403, f"{name} needs the page's CSRF token in the {CSRF_HEADER} header: reload the page")
        body = request.get_json(silent=True)
        if not isinstance(body, dict):
            abort(400, f"{name} takes a JSON object")
        # 4: what the command does.
        try:
            said = actions[name](body)
        except OptionError as error:
            abort(400, f"{name}: {error}")
        except (SegmentChangeError, CheckpointError) as error:
            abort(409, f"{name}: {error}; nothing changed")
        log.info("%s from %s: %s", name, request.remote_addr, said)
        return make_response(f"{name}: {said}\n", 200, {"Content-Type": "text/plain; charset=utf-8"})

    return blueprint
