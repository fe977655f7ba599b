"""``segack ui``: the page of a checkpoint, its state as JSON and its metrics, served on loopback by
a real server; who may ask; its controls (split, merge, scale, release), what they refuse and that a
refusal writes nothing; and the page in Debian's Chromium (headless, through Playwright) following a
checkpoint that a real command changes without a reload, then steering a real replay."""

from __future__ import annotations

import collections
import contextlib
import hashlib
import itertools
import json
import os
import random
import re
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from segack.cli import ExitCode, main
from segack.kernel import SegmentSet
from segack.spark_adapter.console.page import create_app, hash_space_layout, page_state, serve_page
from segack.spark_adapter.errors import OptionError
from segack.spark_adapter.store.claims import acquire, latest_claim
from tests.test_metrics import sample_value, scrape
from tests.test_rescale import _checkpoint
from tests.test_rescale_spark import assert_each_event_ran_in_its_members_partition

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
#: The token the tests' pages are served with; their requests carry it unless told not to.
TOKEN = "t0ken-of-the-tests"


def _get(url: str, headers: dict[str, str] | None = None, data: bytes | None = None,
         token: str | None = TOKEN) -> tuple[int, str, dict[str, str]]:
    """A request with ``token`` as a bearer token (``None``: without one)."""
    request = urllib.request.Request(url, data=data, headers=(
        {"Authorization": f"Bearer {token}"} if token else {}) | (headers or {}))
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        with opener.open(request, timeout=10) as response:
            return response.status, response.read().decode(), dict(response.headers)
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(), dict(error.headers)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def _post(base: str, action: str, body: object, csrf: str | None, token: str | None = TOKEN
          ) -> tuple[int, str]:
    """A control's POST as the page makes it: JSON, with the CSRF header unless ``csrf`` is None."""
    headers = {"Content-Type": "application/json"} | ({"X-Segack-CSRF": csrf} if csrf is not None else {})
    status, said, _ = _get(f"{base}/api/{action}", headers, json.dumps(body).encode(), token)
    return status, said


def _csrf(base: str, token: str | None = TOKEN) -> str | None:
    """The CSRF token the page's state gives (None: a read-only page)."""
    return json.loads(_get(f"{base}/api/state", token=token)[1]).get("csrf")


def _checksums(path: Path) -> dict[str, str]:
    return {str(file.relative_to(path)): hashlib.sha256(file.read_bytes()).hexdigest()
            for file in sorted(path.rglob("*")) if file.is_file()}


def test_the_state_the_page_draws_is_the_checkpoints(tmp_path):
    store = _checkpoint(tmp_path, SegmentSet.balanced(3), bits=4, counts=[7] * 16)
    with serve_page(store, port=0, token=TOKEN) as server:
        status, body, headers = _get(f"http://127.0.0.1:{server.port}/api/state")
        assert status == 200 and headers["Content-Type"] == "application/json"
        state = json.loads(body)
        page_status, page, _ = _get(f"http://127.0.0.1:{server.port}/")
        script_status, script, _ = _get(f"http://127.0.0.1:{server.port}/static/page.js")
        samples = scrape(server.port, TOKEN)
    assert state["exists"] and state["kind"] == "replay" and state["state"] == "stopped"
    assert state["events"] == {"done": 0, "handled": 0, "dead_letters": 0, "total": 16 * 7,
                               "in_flight": 0, "pending": 0, "retries": 0}
    # balanced(3) of 16 key groups: one segment of mask 1 (8 groups), two of mask 3 (4 each).
    assert [(s["segment_id"], s["mask"], s["key_groups"], s["load"]) for s in state["segments"]] == [
        (0, 3, 4, 28), (1, 1, 8, 56), (2, 3, 4, 28)]
    assert [len(strip) for strip in state["strips"]] == [4, 8, 4]
    # Siblings at mask 3 (ids 0 and 2) merge; id 1's sibling, 0 at mask 1, is split further.
    assert [s["mergeable"] for s in state["segments"]] == [True, False, True]
    assert state["requested"] is None
    assert state["hottest_key_group"] == {"key_group": 0, "events": 7, "share": 1 / 16}  # all alike
    assert state["history"][-1]["layout"] == [[0, 0.0, 0.25], [2, 0.25, 0.25], [1, 0.5, 0.5]]
    # The whole hash space has no sibling.
    [root] = page_state(_checkpoint(tmp_path / "root", SegmentSet.balanced(1)))["segments"]
    assert root["mask"] == 0 and not root["mergeable"]
    assert state["history"][-1]["segments"] == 3 and state["history"][-1]["why"] == "start of run r1"
    assert state["claim"]["released"] and not state["claim"]["live"]
    # The page's shell holds nothing of the checkpoint: its script fills it in from the state.
    assert page_status == 200 and "page.js" in page and store.location not in page
    assert state["checkpoint"] == store.location
    assert script_status == 200 and "api/state" in script
    assert sample_value(samples, "segack_segments") == 3


def _recorded(store, **settings: Any):
    """``store``'s checkpoint with ``settings`` recorded in it, as the end of a run records them."""
    state = store.load()
    state.settings.update(settings)
    store.save(state)
    return store


#: How a run's end is recorded, what the page and the metrics call it, and what ``segack status``
#: says of it: the same condition in the three.
ENDINGS = {
    "replay killed": ({"status": "running"}, "interrupted",
                      "stopped before its end (killed, or its machine lost); the next run resumes it"),
    "replay asked to stop": ({"status": "incomplete"}, "stopped",
                             "stopped before its end, its progress saved (asked to stop"),
    "replay failed": ({"status": "failed"}, "failed", "stopped: its last run failed"),
    "replay read to its end": ({"status": "complete"}, "complete", "complete: every event handled"),
    "stream stopped between micro-batches": (
        {"status": "complete", "stream": {"completed_batch": 3, "events": 48}}, "stopped",
        "stopped between micro-batches: every event of its micro-batches handled; the next run reads on"),
    "stream killed in a micro-batch": ({"status": "running", "stream": {"completed_batch": 3, "events": 48}},
                                       "interrupted", "stopped before its end (killed"),
    "real-time stopped": ({"status": "stopped", "mode": "real-time", "topic": "accounts"}, "stopped",
                          "stopped when asked, its progress saved; the next run resumes it"),
    "real-time killed": ({"status": "running", "mode": "real-time", "topic": "accounts"}, "interrupted",
                         "stopped before its end (killed"),
}


@pytest.mark.parametrize("ending", list(ENDINGS))
def test_how_a_run_ended_is_said_alike_by_the_page_its_metrics_and_status(tmp_path, capsys, ending):
    """A stream stopped cleanly is not called killed, nor one stopped with lag complete."""
    recorded, condition, said = ENDINGS[ending]
    store = _recorded(_checkpoint(tmp_path / "ckpt", SegmentSet.balanced(2), bits=4, counts=[3] * 16),
                      **recorded)
    assert page_state(store)["state"] == condition
    with serve_page(store, port=0, token=TOKEN) as server:
        [(labels, _)] = scrape(server.port, TOKEN)["segack_run_info"]
    assert labels["state"] == condition
    assert main(["status", store.location]) == ExitCode.OK
    [line] = [line for line in capsys.readouterr().out.splitlines() if line.startswith("status ")]
    assert line.split(None, 1)[1].startswith(said), line
    # Claimed by a live run, each is running.
    acquire(store, "run-2", 60)
    assert page_state(store)["state"] == "running"


def test_the_page_has_words_for_every_condition():
    script = (ROOT / "src/segack/spark_adapter/console/static/page.js").read_text()
    states = re.search(r"const STATES = \{(.*?)\};", script, re.S).group(1)
    worded = set(re.findall(r"(\w+): \"", states))
    assert worded == {condition for _, condition, _ in ENDINGS.values()} | {"running", "dead_letters_left"}


def _real_time_pending(path: Path, pending: list[int]):
    """A real-time stream's checkpoint whose partitions each hold ``pending`` records read, not done."""
    from segack.spark_adapter.store.checkpoint import Checkpoint, CheckpointStore

    store = CheckpointStore(str(path))
    store.save(Checkpoint({"mode": "real-time", "topic": "accounts", "key": "key", "order": "offset",
                           "updated_at": 1.0, "status": "running"}), 1)
    for partition, records in enumerate(pending):
        lease, _ = store.partitions.take_over(partition, {"run": "r", "claim": 1, "attempt": "a"}, {})
        store.partitions.save(lease, {"next": 1_000, "read": 1_000 + records, "end": 1_000 + records,
                                      "pending": records, "done": [], "handled_total": 1_000, "claim": 1})
    return store


@pytest.mark.parametrize(("pending", "behind"), [
    ([2, 1, 0], None),  # a few records in calls at a hundred a second: nobody is behind
    ([5_000, 12, 40], 0),
    ([30, 4_000, 1_900], 1),  # twice the next
    ([3_000, 2_000, 0], None),  # two far behind: neither is behind the others
    ([150], 0),
    ([], None),
])
def test_a_partition_holds_the_run_back_only_while_a_run_is_live_and_far_behind_the_others(
        tmp_path, capsys, pending, behind):
    store = _real_time_pending(tmp_path / "ckpt", pending)
    marked = [partition["partition"] for partition in page_state(store)["stream"]["partitions"]
              if partition["holds_back"]]
    assert marked == []  # no live run: nothing is held back
    acquire(store, "run-2", 60)
    marked = [partition["partition"] for partition in page_state(store)["stream"]["partitions"]
              if partition["holds_back"]]
    assert marked == ([] if behind is None else [behind])
    assert main(["status", store.location]) == ExitCode.OK
    said = [line.split()[0] for line in capsys.readouterr().out.splitlines() if "holds the run back" in line]
    assert said == ([] if behind is None else [f"accounts/{behind}"])


def test_requests_from_elsewhere_or_without_the_token_are_refused_and_change_nothing(tmp_path):
    store = _checkpoint(tmp_path)
    before = _checksums(tmp_path / "checkpoint")
    # Only a read-only page on loopback goes without a token: it answers this machine alone.
    with serve_page(store, port=0, read_only=True) as server:
        assert server.token is None
        url = f"http://127.0.0.1:{server.port}/api/state"
        status, body, _ = _get(url, {"Host": f"attacker.example:{server.port}"}, token=None)
        assert status == 403 and "answers requests to this machine only" in body
        assert _get(url, {"Host": f"localhost:{server.port}"}, token=None)[0] == 200
    with serve_page(store, host="127.0.0.1", port=0, token="s3cret") as server:
        base = f"http://127.0.0.1:{server.port}"
        # A cookie carries nothing: a browser would send it to every port of the host.
        for headers in ({}, {"Cookie": f"segack_token_{server.port}=s3cret"},
                        {"Cookie": "segack_token=s3cret"}, {"Authorization": "Bearer wrong"},
                        {"Authorization": "Basic s3cret"}, {"Authorization": "Bearer"},
                        {"Authorization": "s3cret"}):
            status, body, _ = _get(f"{base}/api/state", headers, token=None)
            assert status == 401 and "needs its token" in body and "#token=" in body, headers
        # Text that is not ASCII, in the address or the header: refused, not a crash.
        for headers, query in (({}, "?token=s%C3%A9cret"),
                               ({"Authorization": "Bearer sécret".encode().decode("latin-1")}, "")):
            assert _get(f"{base}/api/state{query}", headers, token=None)[0] == 401, (headers, query)
        assert _get(f"{base}/metrics", token=None)[0] == 401
        assert _get(f"{base}/api/state?token=wrong", token=None)[0] == 401
        # An address as earlier releases printed it: the token moves to the fragment, no cookie set.
        status, _, headers = _get(f"{base}/?token=s3cret", token=None)
        assert status == 302 and headers["Location"].endswith("/#token=s3cret")
        assert "Set-Cookie" not in headers
        # The shell and its script, without the token: nothing of the checkpoint, no CSRF token.
        csrf = _csrf(base, "s3cret")
        assert csrf
        for path in ("/", "/static/page.js"):
            status, body, _ = _get(base + path, token=None)
            assert status == 200 and store.location not in body and csrf not in body, path
        assert _get(f"{base}/api/state", {"Authorization": "bearer\ts3cret "}, token=None)[0] == 200
        # Prometheus scrapes with the token as a bearer token.
        assert sample_value(scrape(server.port, "s3cret"), "segack_segments") == 2
        # No page elsewhere may frame it, whatever the answer.
        for answer in (_get(f"{base}/", token="s3cret"), _get(f"{base}/", token=None)):
            assert answer[2]["X-Frame-Options"] == "DENY"
            policy = answer[2]["Content-Security-Policy"].split("; ")
            assert "frame-ancestors 'none'" in policy and "script-src 'self'" in policy, policy
            assert "connect-src 'self'" in policy and answer[2]["Referrer-Policy"] == "no-referrer"
    # A token that is not ASCII works in a bearer header, as its UTF-8 bytes read as Latin-1: even
    # one whose last byte is what Unicode calls a space there (A0 in "à", 85 in "ą").
    for token in ("voilà", "mąką", "sécret"):
        with serve_page(store, port=0, token=token) as server:
            sent = {"Authorization": f"Bearer {token}".encode().decode("latin-1")}
            assert _get(f"http://127.0.0.1:{server.port}/api/state", sent, token=None)[0] == 200
    with serve_page(store, port=0, token="sécret") as server:
        base = f"http://127.0.0.1:{server.port}"
        status, _, headers = _get(f"{base}/?token=s%C3%A9cret", token=None)
        assert status == 302 and headers["Location"].endswith("/#token=s%C3%A9cret")
        sent = "Bearer sécret".encode().decode("latin-1")
        assert _get(f"{base}/api/state", {"Authorization": sent}, token=None)[0] == 200
        # A CSRF header that is not ASCII is refused as any other wrong one.
        headers = {"Authorization": sent, "Content-Type": "application/json",
                   "X-Segack-CSRF": "jé".encode().decode("latin-1")}
        status, said, _ = _get(f"{base}/api/split", headers, b'{"segment_id": 0}', token=None)
        assert (status, said) == (
            403, "split needs the page's CSRF token in the X-Segack-CSRF header: reload the page\n")
    assert _checksums(tmp_path / "checkpoint") == before


def test_a_page_with_controls_needs_a_token_on_loopback_too(tmp_path):
    # Any process here may read a page on loopback, and the CSRF token in it: the controls need
    # the token only the one who started the page was told.
    store = _checkpoint(tmp_path)
    before = _checksums(tmp_path / "checkpoint")
    with serve_page(store, port=0) as server:
        assert server.token and len(server.token) >= 24 and server.url.endswith(f"/#token={server.token}")
        base = f"http://127.0.0.1:{server.port}"
        for path in ("/api/state", "/metrics"):
            assert _get(base + path, token=None)[0] == 401, path
        assert _post(base, "split", {"segment_id": 0}, "any", token=None)[0] == 401
        assert _checksums(tmp_path / "checkpoint") == before
        csrf = _csrf(base, server.token)
        assert _post(base, "split", {"segment_id": 0}, csrf, server.token)[0] == 200
    with pytest.raises(OptionError, match="a page with controls needs a token"):
        create_app(store)


def test_a_set_is_drawn_as_the_hash_space_cut_by_its_splits():
    # Low bits read backwards: 0 (mask 7) and 4 (mask 7) share the first quarter, the children of
    # segment 0 at mask 3.
    assert hash_space_layout([0, 1, 2, 3, 4]) == [(0, 0.0, 0.125), (4, 0.125, 0.125), (2, 0.25, 0.25),
                                                   (1, 0.5, 0.25), (3, 0.75, 0.25)]
    assert hash_space_layout([0]) == [(0, 0.0, 1.0)]
    segments, pick = SegmentSet.balanced(1), random.Random(5)
    for _ in range(40):  # splits of random segments: each cuts its block in two, the blocks tile
        member = pick.choice(list(segments))
        before = {placed[0]: placed[1:] for placed in hash_space_layout(list(segments.ids))}
        segments = segments.split(member)
        after = {placed[0]: placed[1:] for placed in hash_space_layout(list(segments.ids))}
        start, share = before[member.segment_id]
        sibling = member.segment_id | (member.mask + 1)
        assert after[member.segment_id] == (start, share / 2)
        assert after[sibling] == (start + share / 2, share / 2)
        ends = sorted(after.values())
        assert ends[0][0] == 0 and all(a[0] + a[1] == b[0] for a, b in itertools.pairwise(ends))
        assert sum(share for _, share in ends) == 1


def test_the_busiest_key_group_bounds_every_segment_set(tmp_path):
    counts = [*range(15), 3]
    store = _checkpoint(tmp_path, bits=4, counts=counts)
    state = page_state(store)
    assert state["hottest_key_group"] == {"key_group": 14, "events": 14, "share": 14 / 108}
    owners = SegmentSet.balanced(2).key_group_owners(4)
    mine = [[count for count, owner in zip(counts, owners, strict=True) if owner == position]
            for position in (0, 1)]
    assert [segment["busiest"] for segment in state["segments"]] == [max(counts) for counts in mine]
    assert max(segment["busiest"] for segment in state["segments"]) == 14
    assert page_state(_checkpoint(tmp_path / "uncounted"))["hottest_key_group"] is None


def test_a_control_refused_answers_why_in_one_line_and_changes_nothing(tmp_path):
    store = _checkpoint(tmp_path, SegmentSet.balanced(3), bits=4, counts=[7] * 16)
    before = _checksums(tmp_path / "checkpoint")
    with serve_page(store, port=0, token=TOKEN) as server:
        base = f"http://127.0.0.1:{server.port}"
        csrf = _csrf(base)
        assert csrf and len(csrf) >= 24
        refusals = [
            ("split", {"segment_id": 0}, None, 403, "split needs the page's CSRF token in the X-Segack-CSRF "
                                                  "header: reload the page"),
            ("split", {"segment_id": 0}, "forged", 403, "split needs the page's CSRF token"),
            ("split", [0], csrf, 400, "split takes a JSON object"),
            ("split", {"segment_id": "0"}, csrf, 400, "split: split needs a segment id (an int), not '0'"),
            ("split", {"segment_id": 99}, csrf, 409, "split: segment 99 is not live; the live segments are "
                                                     "[0, 1, 2]; nothing changed"),
            ("merge", {"segment_id": 1}, csrf, 409, "merge: segment 1 cannot be merged: its sibling"),
            ("scale", {"segments": "many"}, csrf, 400, "scale: segments must be"),
            ("scale", {"segments": 32}, csrf, 409, "scale: "),  # finer than 16 key groups
            ("scale", {"segments": 4, "workers": 0}, csrf, 400, "scale: workers must be a positive int"),
            ("release", {"claim": "1"}, csrf, 400, "release: release needs the number of the claim"),
            ("release", {"claim": 99}, csrf, 409, "release: claim 99 is no longer the newest"),
            ("release", {"claim": 1, "force": "yes"}, csrf, 400, "release: release's force is true or false"),
        ]
        for action, body, token, status, said in refusals:
            answer = _post(base, action, body, token)
            assert answer[0] == status and answer[1].startswith(said) and answer[1].count("\n") == 1, (
                action, body, answer)
        # Not JSON at all, and a GET where only a POST does anything.
        assert _get(f"{base}/api/split", {"X-Segack-CSRF": csrf}, b"segment_id=0")[0] == 400
        assert _get(f"{base}/api/split")[0] == 405
    assert _checksums(tmp_path / "checkpoint") == before
    with serve_page(store, port=0, read_only=True) as server:
        base = f"http://127.0.0.1:{server.port}"
        page = _get(f"{base}/")[1]
        assert _csrf(base) is None
        assert 'id="release"' not in page and 'id="scale-form"' not in page and "read-only" in page
        for action, body in (("split", {"segment_id": 0}), ("release", {"claim": 1})):
            status, said = _post(base, action, body, "anything")
            assert (status, said) == (403, "this page is read-only (segack ui --read-only): it changes "
                                           "nothing\n")
    assert _checksums(tmp_path / "checkpoint") == before


def test_each_control_does_what_its_command_does(tmp_path):
    store = _checkpoint(tmp_path, SegmentSet.balanced(3), bits=4, counts=[7] * 16)
    with serve_page(store, port=0, token=TOKEN) as server:
        base = f"http://127.0.0.1:{server.port}"
        csrf = _csrf(base)
        assert _post(base, "merge", {"segment_id": 2}, csrf) == (
            200, "merge: 3 -> 2 segments (0,1); the next run starts over them\n")
        assert _post(base, "split", {"segment_id": 1}, csrf) == (
            200, "split: 2 -> 3 segments (0,1,3); the next run starts over them\n")
        assert _post(base, "scale", {"segments": [0, 1, 2, 3]}, csrf) == (
            200, "scale: 3 -> 4 segments (0,1,2,3); the next run starts over them\n")
        assert _post(base, "scale", {"segments": 4}, csrf) == (
            200, "scale: the segments are 0,1,2,3 already; nothing to do\n")
        assert store.load().settings["segments"] == [0, 1, 2, 3]
        history = store.load().settings["segment_history"]
        assert [entry["why"].split(" (by")[0] for entry in history[1:]] == [
            "merge segment 2", "split segment 1", "scale to 4 segments"]
        # A run that holds the checkpoint gets a request, as from the command.
        live = acquire(store, "r2", 60)
        status, said = _post(base, "split", {"segment_id": 0}, csrf)
        owner = f"run r2 (pid {os.getpid()} on {socket.gethostname()})"
        assert (status, said) == (200, f"split: asked {owner} to change 4 -> 5 segments (0,1,2,3,4); it "
                                       "applies them within seconds (a stream: at its next micro-batch)\n")
        requested = json.loads(_get(f"{base}/api/state")[1])["requested"]
        assert requested["why"] == "split segment 0" and requested["segments"] == 5
        assert store.load().settings["segments"] == [0, 1, 2, 3]
        # Release names the claim it saw. A live run's stops that run: it needs force, which the
        # page asks its user for first; then (released already) nothing to do.
        before = _checksums(tmp_path / "checkpoint")
        for body in ({"claim": live.number}, {"claim": live.number, "force": False}):
            assert _post(base, "release", body, csrf) == (
                409, f"release: claim {live.number} is held by {owner}, which is live: releasing it stops "
                     f"that run; send force: true to release it anyway; nothing changed\n")
        assert _checksums(tmp_path / "checkpoint") == before
        status, said = _post(base, "release", {"claim": live.number, "force": True}, csrf)
        assert status == 200 and said.startswith("release: released the claim of run r2"), said
        released = latest_claim(store)
        assert released.released and released.number == live.number + 1
        assert "segack ui" in released.released_by
        assert _post(base, "release", {"claim": released.number}, csrf)[1] == (
            f"release: claim {released.number} is released already; nothing to do\n")


def test_any_address_but_loopback_gets_a_token_made_for_it(tmp_path):
    store = _checkpoint(tmp_path)
    with serve_page(store, host="0.0.0.0", port=0) as server:
        assert server.token and len(server.token) >= 24 and f"#token={server.token}" in server.url
        assert _get(f"http://127.0.0.1:{server.port}/api/state", token=None)[0] == 401
    for port, token in ((70000, None), (-1, None), (True, None), (0, "")):
        with pytest.raises(OptionError):
            serve_page(store, port=port, token=token)


def test_the_command_serves_until_sigterm_and_refuses_what_it_cannot_serve(tmp_path, capsys):
    store = _checkpoint(tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["ui", store.location, "--port", str(port)]) == ExitCode.USAGE
        [line] = capsys.readouterr().err.splitlines()
        assert line == f"segack ui: cannot serve the page on 127.0.0.1:{port}: Address already in use", line
    (tmp_path / "not-a-checkpoint").mkdir()
    (tmp_path / "not-a-checkpoint" / "notes.txt").write_text("mine")
    assert main(["ui", str(tmp_path / "not-a-checkpoint"), "--port", "0"]) == ExitCode.REFUSED
    assert (tmp_path / "not-a-checkpoint" / "notes.txt").read_text() == "mine"
    with _serving([store.location, "--port", "0"], stderr=subprocess.PIPE) as process:
        line = process.stdout.readline()
        assert line.startswith(f"segack ui: serving {store.location} on http://127.0.0.1:"), line
        url, token = line.split(" on ")[1].split()[0].split("#token=")
        assert _get(f"{url}api/state", token=None)[0] == 401
        assert _get(f"{url}api/state", token=token)[0] == 200
        base = url.rstrip("/")
        assert _post(base, "split", {"segment_id": 0}, _csrf(base, token), token)[0] == 200
        process.terminate()
        assert process.wait(30) == ExitCode.OK
        # No line per request; one per control done.
        assert process.stderr.read() == ("segack: split from 127.0.0.1: 2 -> 3 segments (0,1,2); the next "
                                         "run starts over them\n")
    with _serving([store.location, "--port", "0", "--read-only"]) as process:
        line = process.stdout.readline()
        assert line.endswith(" (Ctrl-C stops, read-only)\n"), line
        url = line.split(" on ")[1].split()[0].rstrip("/")
        assert _csrf(url, None) is None and _post(url, "split", {"segment_id": 0}, "x", None)[0] == 403
        process.terminate()
        assert process.wait(30) == ExitCode.OK


@contextlib.contextmanager
def _serving(arguments: list[str], **popen: Any) -> Iterator[subprocess.Popen[str]]:
    """``segack ui ARGUMENTS`` started, its output a pipe; killed at the end should a failed check
    have left it serving."""
    process = subprocess.Popen([sys.executable, "-m", "segack", "ui", *arguments], cwd=ROOT,
                               stdout=subprocess.PIPE, text=True, **popen)
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(30)


def test_the_commands_token_comes_from_a_file_or_the_environment_and_is_not_printed(tmp_path, capsys):
    store = _checkpoint(tmp_path)
    (tmp_path / "empty").write_text("\n")
    (tmp_path / "binary").write_bytes(b"\xff\xfe")
    refusals = {"missing": "cannot read {}: No such file or directory",
                "empty": "{} holds no token on its first line", "binary": "{} is not UTF-8 text"}
    for name, said in refusals.items():
        path = tmp_path / name
        assert main(["ui", store.location, "--port", "0", "--token-file", str(path)]) == ExitCode.USAGE
        assert capsys.readouterr().err == f"segack ui: argument --token-file: {said.format(path)}\n"
    (tmp_path / "token").write_text("from-a-file\nignored\n")
    from_environment = "from-the-environment"
    for flags, environment, token in ((["--token-file", str(tmp_path / "token")], {}, "from-a-file"),
                                      ([], {"SEGACK_UI_TOKEN": from_environment}, from_environment)):
        arguments = [store.location, "--port", "0", *flags]
        with _serving(arguments, env=dict(os.environ, **environment)) as process:
            line = process.stdout.readline()
            assert line.endswith("/ (Ctrl-C stops; requests carry the token given)\n") and token not in line
            url = line.split(" on ")[1].split()[0]
            assert _get(f"{url}api/state", token=None)[0] == 401
            assert _get(f"{url}api/state", token=token)[0] == 200
            process.terminate()
            assert process.wait(30) == ExitCode.OK


@pytest.mark.browser
def test_a_token_is_read_from_the_address_as_printed_or_typed_and_the_page_stops_asking_a_gone_server(
        tmp_path):
    from playwright.sync_api import sync_playwright

    store = _checkpoint(tmp_path, SegmentSet.balanced(2), bits=4, counts=[3] * 16)
    token = "50%off & #1 é"  # what a --token-file may hold: printed percent-encoded, typed as it is
    errors: list[str] = []
    with serve_page(store, port=0, token=token) as server, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            pages = []
            for address in (server.url, f"{server.address}#token={token}"):
                page = browser.new_context(bypass_csp=True).new_page()  # Playwright evaluates strings
                page.on("pageerror", lambda error: errors.append(str(error)))
                page.goto(address)
                page.wait_for_function("document.querySelectorAll('#segments tbody tr').length === 2")
                assert errors == [] and page.evaluate("location.hash") == "", address
                pages.append(page)
            server.close()
            stopped = "document.querySelector('#updated').textContent.includes('stopped asking')"
            # Each page counts its own misses, on its own timers: both must have stopped.
            for page in pages:
                page.wait_for_function(stopped, timeout=60_000)
            # Another process on the port the page asked: it is asked nothing, so sent no token.
            with _capturing(server.port) as sent:
                page.wait_for_timeout(3 * 2_000)
            assert sent == []
        finally:
            browser.close()


@pytest.mark.browser
def test_a_page_whose_port_another_process_took_asks_it_once_and_stops(tmp_path):
    from playwright.sync_api import sync_playwright

    store = _checkpoint(tmp_path, SegmentSet.balanced(2), bits=4, counts=[3] * 16)
    with serve_page(store, port=0, token="secret") as server, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_context(bypass_csp=True).new_page()
            page.goto(server.url)
            page.wait_for_function("document.querySelectorAll('#segments tbody tr').length === 2")
            server.close()
            # Taken before the page missed an answer: only what it answers tells the page.
            with _capturing(server.port) as sent:
                page.wait_for_function("document.querySelector('#updated').textContent.includes("
                                       "'not as segack ui: the page stopped asking')", timeout=30_000)
                page.wait_for_timeout(3 * 2_000)
            assert [headers["Authorization"] for headers in sent] == ["Bearer secret"]
        finally:
            browser.close()


@contextlib.contextmanager
def _capturing(port: int = 0):
    """A server on ``port`` of this machine (0: a free one) that answers every GET; it yields a list
    (its port in the list's ``port``) that holds, once the block ends, the headers it got."""
    import http.server
    import threading

    sent: list[dict[str, str]] = []

    class Capture(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            sent.append(dict(self.headers))
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"elsewhere")

        def log_message(self, format, *args):
            pass

    class Headers(list):
        port = 0

    other = http.server.ThreadingHTTPServer(("127.0.0.1", port), Capture)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    found = Headers()
    found.port = other.server_port
    try:
        yield found
    finally:
        other.shutdown()
        other.server_close()
        found.extend(sent)


def _headers_sent_elsewhere(context) -> dict[str, str]:
    """The headers ``context``'s browser sends to a server on another port of this machine."""
    with _capturing() as sent:
        page = context.new_page()
        page.goto(f"http://127.0.0.1:{sent.port}/")
        page.close()
    return sent[0]


@contextlib.contextmanager
def _browser_page(store) -> Iterator[Any]:
    """A headless Chromium tab on ``store``'s page, its state drawn once."""
    from playwright.sync_api import sync_playwright

    with serve_page(store, port=0) as server, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(bypass_csp=True)  # Playwright evaluates strings
            errors: list[str] = []
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.goto(server.url)
            page.wait_for_function("document.querySelector('#updated').textContent.startsWith('read ')")
            yield page
            assert errors == []
        finally:
            browser.close()


def _shown(page, selector: str) -> bool:
    return page.evaluate(f"getComputedStyle(document.querySelector({selector!r})).display") != "none"


@pytest.mark.browser
def test_the_page_draws_a_micro_batch_stream_as_one_with_no_end_and_times_as_status_does(tmp_path):
    store = _recorded(_checkpoint(tmp_path, SegmentSet.balanced(2), bits=4, counts=[3] * 16),
                      status="complete", stream={"completed_batch": 3, "events": 48, "commit_offsets_to": "g",
                                                 "partitions": [["accounts", 0, 40, 52]],
                                                 "last_batch": {"id": 3, "at": 1.0, "seconds": 1.5}})
    with _browser_page(store) as page:
        assert page.inner_text("#state") == "stream: stopped, its progress saved: the next run resumes it"
        assert not _shown(page, "#events-section .bar")  # a stream has no end to fill a bar to
        assert page.inner_text("#segments-scope") == "events and done: micro-batch 3's, the last complete"
        assert not _shown(page, "#pending-head")
        cells = page.eval_on_selector_all("#partitions tbody tr", "rows => rows.map(r => r.cells.length)")
        assert cells == [6]
        assert re.fullmatch(r"read \d\d:\d\d:\d\d", page.inner_text("#updated"))
        [entry] = page.eval_on_selector_all("#history li",
                                            "items => items.map(i => i.firstChild.textContent)")
        assert re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d: 2 segments, start of run r1", entry), entry


@pytest.mark.browser
def test_the_page_draws_a_real_time_streams_pending_records_and_the_partition_behind(tmp_path):
    store = _real_time_pending(tmp_path / "ckpt", [5_000, 10])
    acquire(store, "run-2", 60)
    with _browser_page(store) as page:
        assert _shown(page, "#pending-head") and not _shown(page, "#segments-scope")
        pending = page.eval_on_selector_all("#partitions tbody tr",
                                            "rows => rows.map(r => r.cells[6].textContent)")
        assert pending == ["5,000 (holds the run back)", "10"]


@pytest.mark.browser
def test_the_page_in_a_browser_follows_a_split_without_a_reload(tmp_path):
    from playwright.sync_api import sync_playwright

    killed = _checkpoint(tmp_path, SegmentSet.balanced(2), bits=4, counts=[3] * 16)
    store = _recorded(killed, status="running")
    with serve_page(store, port=0) as server, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update"])
        try:
            page = browser.new_context(bypass_csp=True).new_page()  # Playwright evaluates strings
            errors: list[str] = []
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.goto(server.url)
            page.wait_for_function("document.querySelectorAll('#segments tbody tr').length === 2")
            # The token left the address for the tab's storage; no cookie holds it, so another
            # server of this machine the browser visits gets nothing of it.
            assert page.evaluate("[location.hash, document.cookie]") == ["", ""]
            elsewhere = _headers_sent_elsewhere(page.context)
            assert "Cookie" not in elsewhere and server.token not in str(elsewhere), elsewhere
            assert page.title() == f"segack · {store.location}"
            assert page.inner_text("#metrics") == (
                "Prometheus metrics at /metrics, with the token as a bearer token")
            assert page.inner_text("#state") == (
                "replay: stopped before its end (killed, or its machine lost): the next run resumes it")
            assert "0 of 48 done" in page.inner_text("#events")
            page.evaluate("window.loads = (window.loads || 0) + 1")
            assert main(["split", store.location, "0"]) == ExitCode.OK  # a real command changes it
            page.wait_for_function("document.querySelectorAll('#segments tbody tr').length === 3",
                                   timeout=15_000)
            assert page.evaluate("window.loads") == 1  # redrawn, not reloaded
            assert page.locator("#history li").count() == 2
            assert "split" in page.inner_text("#history li >> nth=0")
            blocks = [page.locator(f"#history li >> nth={n}").locator(".layout span").all_inner_texts()
                      for n in (0, 1)]
            assert blocks == [["0", "2", "1"], ["0", "1"]]
            # The scale form, refused then done: the answer on the page, the set redrawn.
            answered = "!document.querySelector('#control-message').textContent.endsWith('asking…')"
            page.fill("#scale-to", "many")
            page.click("#scale-form button")
            page.wait_for_function(answered)
            assert page.inner_text("#control-message").startswith("refused (400): scale: segments must be")
            assert page.get_attribute("#control-message", "class") == "refused"
            page.fill("#scale-to", "0, 1, 2, 3")
            page.click("#scale-form button")
            page.wait_for_function(answered)
            assert page.inner_text("#control-message") == (
                "scale: 3 -> 4 segments (0,1,2,3); the next run starts over them")
            page.wait_for_function("document.querySelectorAll('#segments tbody tr').length === 4")
            assert page.locator("#release").is_hidden()  # the claim is released already
            # A run's claim: released from the page once the operator confirms.
            live = acquire(store, "r2", 60)
            page.wait_for_selector("#release", state="visible")
            dialogs: list[str] = []
            page.once("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.accept()))
            page.click("#release")
            page.wait_for_function(answered)
            assert dialogs[0].startswith("Release the claim of run r2") and "It is live" in dialogs[0]
            assert page.inner_text("#control-message").startswith("release: released the claim of run r2")
            assert latest_claim(store).number == live.number + 1 and latest_claim(store).released
            page.wait_for_selector("#release", state="hidden")
            page.screenshot(path=str(tmp_path / "page.png"), full_page=True)
            assert errors == []
        finally:
            browser.close()
    print(f"\nthe page: {tmp_path / 'page.png'}")
    assert os.path.getsize(tmp_path / "page.png") > 10_000


def _status_segments(out: str) -> list[tuple[int, int, int, int]]:
    """``segack status``'s segment lines: (id, mask, events done, key groups)."""
    return [(int(found[1]), int(found[2]), int(found[3].replace(",", "")), int(found[4].replace(",", "")))
            for found in re.finditer(r"#\d+\s+id (\d+)\s+mask (\d+)\s.*?([\d,]+) done\s+([\d,]+) key groups",
                                     out)]


def _page_segments(page) -> list[tuple[int, int, int, int]]:
    """The page's segment rows: (id, mask, events done, key groups)."""
    rows = page.eval_on_selector_all(
        "#segments tbody tr", "rows => rows.map(row => [...row.cells].map(cell => cell.textContent))")
    return [(int(row[1]), int(row[2]), int(row[7].replace(",", "")), int(row[3].replace(",", "")))
            for row in rows]


@pytest.mark.browser
@pytest.mark.spark
def test_split_pressed_on_the_page_splits_a_live_replay_which_keeps_order_and_exactness(tmp_path, capsys):
    from playwright.sync_api import sync_playwright

    from segack.demo import generate_events
    from tests.spark_handlers import LOG_ENV, REFUSED_ENV, read_log
    from tests.test_rescale_spark import _wait_for

    total = 6_000
    table = generate_events(total, seed=41)
    pq.write_table(table, tmp_path / "events.parquet")
    events = list(zip(table.column("user").to_pylist(), table.column("seq").to_pylist(), strict=True))
    sizes = collections.Counter(user for user, _ in events)
    # The hottest user's tenth event, and a lighter one's, are refused: their later events wait.
    refused = {max(sizes, key=sizes.get), min((user for user in sizes if sizes[user] > 20), key=sizes.get)}
    set_aside = {(user, seq) for user, seq in events if user in refused and seq >= 10}
    log, checkpoint = str(tmp_path / "log.jsonl"), str(tmp_path / "checkpoint")
    command = [sys.executable, "-m", "segack", "replay", str(tmp_path / "events.parquet"), "--key", "user",
               "--order", "ts", "--handler", "tests.spark_handlers:record_with_task_refusing_tenth",
               "--checkpoint", checkpoint, "--segments", "2", "--flush-interval", "0.3",
               "--on-error", "dead-letter"]
    process = subprocess.Popen(command, cwd=ROOT, env=dict(os.environ, **{LOG_ENV: log,
                                                                          REFUSED_ENV: ",".join(refused)}),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(lambda: len(read_log(log)) > 500, 300, "the replay to handle events", process)
        with serve_page(checkpoint, port=0) as server, sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=[
                "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update"])
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 900}, bypass_csp=True)
                errors: list[str] = []
                page.on("pageerror", lambda error: errors.append(str(error)))
                page.goto(server.url)
                page.wait_for_function("document.querySelector('#state').textContent === 'replay: running'")
                # Segment 1 holds the most events (the refused users' are in 0): its half with
                # segment id 3 still has keys to handle when the split takes effect.
                page.click("#segments tr[data-segment='1'] button.split")
                page.wait_for_function("!document.querySelector('#control-message').textContent"
                                       ".endsWith('asking…')")
                said = page.inner_text("#control-message")
                assert said.startswith("split: asked run ") and "2 -> 3 segments (0,1,3)" in said, said
                page.wait_for_function("document.querySelectorAll('#segments tbody tr').length === 3",
                                       timeout=60_000)
                applied_at = len(read_log(log))
                assert applied_at < total - len(set_aside), "the run ended before the split: no proof"
                assert "split segment 1" in page.inner_text("#history li >> nth=0")
                # The set and the claim as segack status prints them, the run still going.
                assert main(["status", checkpoint]) == ExitCode.OK
                status = capsys.readouterr().out
                without_done = [[(row[0], row[1], row[3]) for row in rows]
                                for rows in (_status_segments(status), _page_segments(page))]
                assert without_done == [[(0, 1, 2048), (1, 3, 1024), (3, 3, 1024)]] * 2
                owner = re.search(r"claim\s+held: (run .+?\)),", status)[1]
                assert owner in page.inner_text("#claim")
                _, err = process.communicate(timeout=600)
                assert process.returncode == ExitCode.DEAD_LETTERS, err
                # After the run, every number on the page is the commands'.
                page.wait_for_function("document.querySelector('#state').textContent"
                                       ".endsWith('dead letters left')", timeout=15_000)
                assert main(["status", checkpoint]) == ExitCode.OK
                status = capsys.readouterr().out
                assert _page_segments(page) == _status_segments(status)
                assert sum(row[2] for row in _page_segments(page)) == total
                handled, aside = total - len(set_aside), len(set_aside)
                assert f"{total:,} in all: {handled:,} handled" in status
                assert f"{aside:,} set aside" in status
                assert page.inner_text("#events") == (
                    f"{total:,} of {total:,} done (100.0%): {handled:,} handled, {aside:,} set aside as dead "
                    "letters")
                assert main(["dead-letters", checkpoint]) == ExitCode.OK
                listed = capsys.readouterr().out.splitlines()
                cells = "rows => rows.map(row => [...row.cells].map(c => c.textContent))"
                rows = page.eval_on_selector_all("#dead-letters tbody tr", cells)
                assert listed[0].split()[-5:] == [f"{aside:,}", "events", "of", "2", "keys"]
                assert [line.split(None, 2) for line in listed[2:]] == [
                    [key, events, error] for key, events, error in rows]
                assert {row[0] for row in rows} == refused
                page.screenshot(path=str(tmp_path / "page.png"), full_page=True)
                assert errors == []
            finally:
                browser.close()
    finally:
        if process.poll() is None:
            process.kill()
    print(f"\nthe page: {tmp_path / 'page.png'}")
    # The split run: each event handled once or set aside, each key in order.
    logged = read_log(log)
    assert len(logged) == len({(event["user"], event["seq"]) for event in logged}) == total - len(set_aside)
    assert {(event["user"], event["seq"]) for event in logged} == set(events) - set_aside
    done: dict[str, int] = {}
    for event in logged:
        assert event["seq"] == done.get(event["user"], -1) + 1, f"{event} handled out of order"
        done[event["user"]] = event["seq"]
    # One job per set, each event in the partition of its key's member: the split took effect in
    # the live run, whose last job had a third partition (segment 3's keys).
    ran = assert_each_event_ran_in_its_members_partition(
        logged, [SegmentSet.from_ids([0, 1]), SegmentSet.from_ids([0, 1, 3])])
    assert 2 in ran[1], ran


def test_a_stream_stopped_with_dead_letters_left_is_not_called_done(tmp_path, capsys):
    import pyarrow as pa

    from segack.spark_adapter.store.checkpoint import DEAD_ATTEMPTS, DEAD_ERROR, DEAD_KEY_GROUP, DEAD_POSITION

    store = _recorded(_checkpoint(tmp_path / "ckpt", SegmentSet.balanced(2), bits=4, counts=[3] * 16),
                      status="complete", stream={"completed_batch": 3, "events": 48})
    store.for_tasks("r1", 1).write_dead_letters("r1-s00000-a0", pa.table({
        "user": ["u1", "u1"], DEAD_KEY_GROUP: [3, 3], DEAD_POSITION: [0, 1], DEAD_ERROR: ["boom"] * 2,
        DEAD_ATTEMPTS: [1, 1]}))
    assert page_state(store)["state"] == "dead_letters_left"
    assert main(["status", store.location]) == ExitCode.OK
    [line] = [line for line in capsys.readouterr().out.splitlines() if line.startswith("status ")]
    assert "handled, 2 dead letters of them set aside (--retry-dead-letters handles them)" in line, line
