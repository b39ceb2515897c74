"""Open every page of the built book in headless Chromium (Debian's, never a downloaded one).

Asserts: no console errors, every math element typeset by the local MathJax, every image loaded, and no request
leaving 127.0.0.1. Skips, saying why, when Chromium or the built book is missing; `make test` provides both.
"""
import functools
import http.server
import shutil
import threading
from urllib.parse import urlparse

import pytest
from conftest import ROOT

HTML = ROOT / "book" / "_build" / "html"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run", "--disable-quic"]


def _pages():
    return sorted(p for p in HTML.rglob("*.html") if not any(s.startswith("_") for s in p.relative_to(HTML).parts))


@pytest.fixture(scope="module")
def server():
    if CHROMIUM is None:
        pytest.skip("Debian's chromium is not installed (apt-get install chromium); .ci/run installs it")
    if not (HTML / "index.html").is_file():
        pytest.skip("the book is not built (make book)")
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass
    handler = functools.partial(Quiet, directory=str(HTML))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def test_every_page_renders_offline(server):
    from playwright.sync_api import sync_playwright
    problems, outside, n_math, n_img = [], [], 0, 0

    def route(r):
        url = r.request.url
        if url.startswith(("data:", "blob:")) or urlparse(url).hostname == "127.0.0.1":
            return r.continue_()
        outside.append(url)
        return r.abort()

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        ctx = browser.new_context()
        ctx.route("**/*", route)
        for path in _pages():
            rel = path.relative_to(HTML).as_posix()
            page = ctx.new_page()
            errors = []
            page.on("console", lambda m, e=errors: e.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda exc, e=errors: e.append(str(exc)))
            page.goto(f"{server}/{rel}", wait_until="networkidle")
            page.evaluate("() => (window.MathJax && MathJax.startup) ? MathJax.startup.promise : null")
            math = page.evaluate("""() => { const m = Array.from(document.querySelectorAll('.math'));
                return {total: m.length, raw: m.filter(e => !e.querySelector('mjx-container')).map(e => e.textContent.slice(0, 60))}; }""")
            imgs = page.evaluate("""() => Array.from(document.images).map(i => ({src: i.src, ok: i.complete && i.naturalWidth > 0}))""")
            n_math += math["total"]
            n_img += len(imgs)
            problems += [f"{rel}: console error: {e}" for e in errors]
            problems += [f"{rel}: math not typeset: {t!r}" for t in math["raw"]]
            problems += [f"{rel}: image not loaded: {i['src']}" for i in imgs if not i["ok"]]
            page.close()
        browser.close()
    assert not outside, f"requests outside 127.0.0.1: {sorted(set(outside))[:10]}"
    assert not problems, "\n".join(problems[:30])
    # the checks above must have had something to check
    assert n_math > 0, "no math element found in the whole book: the typesetting check checked nothing"
    assert n_img > 0, "no image found in the whole book: the image check checked nothing"
