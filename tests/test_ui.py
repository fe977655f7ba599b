"""``segack ui``: the page of a checkpoint, its state as JSON and its metrics, served on loopback by
a real server; who may ask; and the page in Debian's Chromium (headless, through Playwright)
following a checkpoint that a real command changes, without a reload."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from segack.cli import ExitCode, main
from segack.kernel import SegmentSet
from segack.spark_adapter.console.page import serve_page
from segack.spark_adapter.errors import OptionError
from tests.test_metrics import sample_value, scrape
from tests.test_rescale import _checkpoint

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str, dict[str, str]]:
    request = urllib.request.Request(url, headers=headers or {})
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        with opener.open(request, timeout=10) as response:
            return response.status, response.read().decode(), dict(response.headers)
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(), dict(error.headers)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def _checksums(path: Path) -> dict[str, str]:
    return {str(file.relative_to(path)): hashlib.sha256(file.read_bytes()).hexdigest()
            for file in sorted(path.rglob("*")) if file.is_file()}


def test_the_state_the_page_draws_is_the_checkpoints(tmp_path):
    store = _checkpoint(tmp_path, SegmentSet.balanced(3), bits=4, counts=[7] * 16)
    with serve_page(store, port=0) as server:
        status, body, headers = _get(f"http://127.0.0.1:{server.port}/api/state")
        assert status == 200 and headers["Content-Type"] == "application/json"
        state = json.loads(body)
        page_status, page, _ = _get(f"http://127.0.0.1:{server.port}/")
        script_status, script, _ = _get(f"http://127.0.0.1:{server.port}/static/page.js")
        samples = scrape(server.port)
    assert state["exists"] and state["kind"] == "replay" and state["state"] == "stopped"
    assert state["events"] == {"done": 0, "handled": 0, "dead_letters": 0, "total": 16 * 7,
                               "in_flight": 0, "pending": 0}
    # balanced(3) of 16 key groups: one segment of mask 1 (8 groups), two of mask 3 (4 each).
    assert [(s["segment_id"], s["mask"], s["key_groups"], s["load"]) for s in state["segments"]] == [
        (0, 3, 4, 28), (1, 1, 8, 56), (2, 3, 4, 28)]
    assert [len(strip) for strip in state["strips"]] == [4, 8, 4]
    assert state["history"][-1]["segments"] == 3 and state["history"][-1]["why"] == "start of run r1"
    assert state["claim"]["released"] and not state["claim"]["live"]
    assert page_status == 200 and store.location in page and "page.js" in page
    assert script_status == 200 and "api/state" in script
    assert sample_value(samples, "segack_segments") == 3


def test_requests_from_elsewhere_or_without_the_token_are_refused_and_change_nothing(tmp_path):
    store = _checkpoint(tmp_path)
    before = _checksums(tmp_path / "checkpoint")
    with serve_page(store, port=0) as server:
        url = f"http://127.0.0.1:{server.port}/api/state"
        status, body, _ = _get(url, {"Host": f"attacker.example:{server.port}"})
        assert status == 403 and "answers requests to this machine only" in body
        assert _get(url, {"Host": f"localhost:{server.port}"})[0] == 200
    with serve_page(store, host="127.0.0.1", port=0, token="s3cret") as server:
        base = f"http://127.0.0.1:{server.port}"
        for headers in ({}, {"Cookie": "segack_token=wrong"}):
            status, body, _ = _get(f"{base}/api/state", headers)
            assert status == 401 and "needs its token" in body
        assert _get(f"{base}/metrics")[0] == 401
        assert _get(f"{base}/api/state?token=wrong")[0] == 401
        status, _, headers = _get(f"{base}/?token=s3cret")
        assert status == 302 and headers["Location"].endswith("/") and "s3cret" not in headers["Location"]
        assert "segack_token=s3cret" in headers["Set-Cookie"] and "HttpOnly" in headers["Set-Cookie"]
        assert _get(f"{base}/api/state", {"Cookie": "segack_token=s3cret"})[0] == 200
    assert _checksums(tmp_path / "checkpoint") == before


def test_any_address_but_loopback_gets_a_token_made_for_it(tmp_path):
    store = _checkpoint(tmp_path)
    with serve_page(store, host="0.0.0.0", port=0) as server:
        assert server.token and len(server.token) >= 24 and f"?token={server.token}" in server.url
        assert _get(f"http://127.0.0.1:{server.port}/api/state")[0] == 401
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
    process = subprocess.Popen([sys.executable, "-m", "segack", "ui", store.location, "--port", "0"],
                               cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = process.stdout.readline()
    assert line.startswith(f"segack ui: serving {store.location} on http://127.0.0.1:"), line
    url = line.split(" on ")[1].split()[0]
    assert _get(f"{url}api/state")[0] == 200
    process.terminate()
    assert process.wait(30) == ExitCode.OK
    assert process.stderr.read() == ""  # no line per request


@pytest.mark.browser
def test_the_page_in_a_browser_follows_a_split_without_a_reload(tmp_path):
    from playwright.sync_api import sync_playwright

    store = _checkpoint(tmp_path, SegmentSet.balanced(2), bits=4, counts=[3] * 16)
    with serve_page(store, port=0) as server, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update"])
        try:
            page = browser.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.goto(server.url)
            page.wait_for_function("document.querySelectorAll('#segments tbody tr').length === 2")
            assert page.inner_text("#state") == "replay: stopped before its end: the next run resumes it"
            assert "0 of 48 done" in page.inner_text("#events")
            page.evaluate("window.loads = (window.loads || 0) + 1")
            assert main(["split", store.location, "0"]) == ExitCode.OK  # a real command changes it
            page.wait_for_function("document.querySelectorAll('#segments tbody tr').length === 3",
                                   timeout=15_000)
            assert page.evaluate("window.loads") == 1  # redrawn, not reloaded
            assert page.locator("#history li").count() == 2
            assert "split" in page.inner_text("#history li >> nth=0")
            page.screenshot(path=str(tmp_path / "page.png"), full_page=True)
            assert errors == []
        finally:
            browser.close()
    print(f"\nthe page: {tmp_path / 'page.png'}")
    assert os.path.getsize(tmp_path / "page.png") > 10_000
