"""The operations guide's picture of ``segack ui``: a real replay (dead letters on, a slow handler)
split from the page while it runs, photographed in Debian's Chromium.

Run from the repository's root with the test extra installed: ``PYTHONPATH=. python docs/ui_screenshot.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq
from playwright.sync_api import sync_playwright
from tests.spark_handlers import LOG_ENV, REFUSED_ENV, read_log

from segack.demo import generate_events
from segack.spark_adapter.console.page import serve_page

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "images" / "segack-ui-running.png"


def main() -> None:
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as work:
        events, checkpoint, log = f"{work}/events.parquet", f"{work}/ckpt", f"{work}/log.jsonl"
        pq.write_table(generate_events(40_000, seed=41), events)
        replay = subprocess.Popen(
            [sys.executable, "-m", "segack", "replay", events, "--key", "user", "--order", "ts", "--handler",
             "tests.spark_handlers:record_with_task_refusing_tenth", "--checkpoint", checkpoint,
             "--segments", "3", "--concurrency", "2", "--flush-interval", "0.5", "--on-error", "dead-letter"],
            cwd=ROOT, env=dict(os.environ, **{LOG_ENV: log, REFUSED_ENV: "user-000429,user-000009"}),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        try:
            while len(read_log(log)) < 3_000:
                time.sleep(0.2)
            with serve_page(checkpoint, port=0) as server, sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path="/usr/bin/chromium",
                                                     args=["--no-sandbox", "--disable-gpu"])
                page = browser.new_page(viewport={"width": 1180, "height": 900}, bypass_csp=True)
                page.goto(server.url)
                page.wait_for_function("document.querySelector('#state').textContent === 'replay: running'")
                page.click("#segments tr[data-segment='1'] button.split")
                page.wait_for_function("document.querySelectorAll('#segments tbody tr').length === 4",
                                       timeout=60_000)
                time.sleep(6)  # a few refreshes: the rates
                page.screenshot(path=str(OUT), full_page=True)
                browser.close()
        finally:
            replay.kill()
            replay.wait()
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
