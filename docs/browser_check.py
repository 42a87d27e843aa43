"""Check the built site as a person would, in a real headless browser (``make docs-check``, CI).

    python docs/browser_check.py [out/docs/html]

1. Every internal link of every page resolves (the file exists; a ``#fragment`` names an id on it).
2. The site is served from ``127.0.0.1`` on a port this script picks; Debian's ``chromium`` (or
   ``$CHROMIUM``) runs headless and is driven over the DevTools protocol (``websocket-client``).
   The front page, the API page of ``LayerAdaptiveEWCPlugin`` and the first gallery page load with
   no JavaScript exception, no console error and no failed request, and their screenshots
   (``<site>/_screenshots/*.png``) are not blank.
3. The search page finds ``LayerAdaptiveEWCPlugin``.

No browser is a failure (exit 1), never a skip. The script stops only the server and the browser
it started (the browser's own process group).
"""

from __future__ import annotations

import base64
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from functools import partial
from html.parser import HTMLParser
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

API_ID = "avalanche_plugins.layer_adaptive.ewc_plugin.LayerAdaptiveEWCPlugin"
PAGES = {  # screenshot name -> page, and what must be on it (a CSS selector)
    "front_page": ("index.html", "article h1"),
    "api_LayerAdaptiveEWCPlugin": ("generated/api/layer_adaptive.html", f"[id='{API_ID}']"),
    "gallery_01_layer_adaptive_ewc": ("generated/gallery/01_layer_adaptive_ewc.html", ".sphx-glr-script-out"),
}


class Links(HTMLParser):
    """The ids of a page and its internal ``href`` / ``src`` targets."""

    def __init__(self):
        super().__init__()
        self.ids, self.targets = set(), []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if attrs.get("id"):
            self.ids.add(attrs["id"])
        if tag == "a" and attrs.get("name"):
            self.ids.add(attrs["name"])
        for key in ("href", "src"):
            value = attrs.get(key)
            if value and not urlsplit(value).scheme and not value.startswith(("//", "mailto:", "data:")):
                self.targets.append(value)


def parse(path: Path) -> Links:
    links = Links()
    links.feed(path.read_text(errors="replace"))
    return links


def check_links(site: Path) -> list[str]:
    """Broken internal links of every page: ``page: target (why)``."""
    pages = {p: parse(p) for p in site.rglob("*.html")}
    broken = []
    for page, links in pages.items():
        for target in links.targets:
            path, _, fragment = target.partition("#")
            path = path.partition("?")[0]
            dest = (page.parent / unquote(path)).resolve() if path else page
            if dest.is_dir():
                dest = dest / "index.html"
            if not dest.exists():
                broken.append(f"{page.relative_to(site)}: {target} (no such file)")
            elif fragment and dest.suffix == ".html":
                ids = pages[dest].ids if dest in pages else parse(dest).ids
                if unquote(fragment) not in ids:
                    broken.append(f"{page.relative_to(site)}: {target} (no id {fragment!r})")
    return broken


def find_chromium() -> str:
    for name in (os.environ.get("CHROMIUM"), "chromium", "chromium-browser", "google-chrome"):
        if name and shutil.which(name):
            return shutil.which(name)
    sys.exit("browser check FAILED: no chromium found (apt-get install -y chromium, or set $CHROMIUM); "
             "the site is not checked")


class Browser:
    """A headless chromium on a temporary profile, one page driven over the DevTools protocol."""

    def __init__(self, binary: str):
        import websocket  # websocket-client (the [docs] extra)

        self.profile = tempfile.mkdtemp(prefix="avp-chromium-")
        self.proc = subprocess.Popen(
            [binary, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--no-default-browser-check", "--disable-extensions", "--disable-background-networking",
             "--window-size=1280,900", "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
             f"--user-data-dir={self.profile}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        port_file = Path(self.profile) / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not port_file.exists() or not port_file.read_text().strip():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                sys.exit("browser check FAILED: chromium did not start (no DevTools port)")
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        request = urllib.request.Request(f"http://127.0.0.1:{port}/json/new?about:blank", method="PUT")
        target = json.loads(urllib.request.urlopen(request, timeout=10).read())
        self.ws = websocket.create_connection(target["webSocketDebuggerUrl"], timeout=30)
        self.next_id, self.events = 0, []
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.call(f"{domain}.enable")

    def call(self, method: str, **params):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv())
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            self.events.append(message)

    def wait_for(self, method: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        seen = len(self.events)
        while time.monotonic() < deadline:
            if any(e.get("method") == method for e in self.events[seen:]):
                return
            self.ws.settimeout(max(0.1, deadline - time.monotonic()))
            self.events.append(json.loads(self.ws.recv()))
        raise TimeoutError(f"no {method} within {timeout} s")

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return result.get("result", {}).get("value")

    def errors(self, since: int) -> list[str]:
        """Exceptions, console errors and failed requests among the events after ``since``."""
        found = []
        for event in self.events[since:]:
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.exceptionThrown":
                found.append(f"exception: {params['exceptionDetails'].get('text')} "
                             f"{params['exceptionDetails'].get('exception', {}).get('description', '')}")
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                found.append("console.error: " + " ".join(str(a.get("value", a.get("description")))
                                                         for a in params.get("args", [])))
            elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
                found.append(f"log: {params['entry'].get('text')} {params['entry'].get('url', '')}")
            elif method == "Network.loadingFailed" and not params.get("canceled"):
                found.append(f"request failed: {params.get('errorText')}")
        return found

    def close(self) -> None:
        if getattr(self, "ws", None) is not None:
            self.ws.close()
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)  # the session chromium was started in
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        shutil.rmtree(self.profile, ignore_errors=True)


def not_blank(png: bytes) -> str | None:
    """Why a screenshot looks blank (one colour, or almost), or None."""
    from PIL import Image, ImageStat

    image = Image.open(io.BytesIO(png)).convert("L")
    colours = len(image.getcolors(maxcolors=1 << 16) or range(1 << 16))
    spread = ImageStat.Stat(image).stddev[0]
    return None if colours > 16 and spread > 5 else f"blank ({colours} grey levels, stddev {spread:.1f})"


def open_page(browser: Browser, url: str) -> int:
    since = len(browser.events)
    browser.call("Page.navigate", url=url)
    browser.wait_for("Page.loadEventFired")
    time.sleep(0.5)  # late scripts (search index, theme) report their errors
    browser.evaluate("1")  # drain the events that came meanwhile
    return since


def check_pages(browser: Browser, base: str, shots: Path) -> list[str]:
    failures = []
    for name, (page, selector) in PAGES.items():
        since = open_page(browser, f"{base}/{page}")
        failures += [f"{page}: {e}" for e in browser.errors(since)]
        if not browser.evaluate(f"document.querySelector({json.dumps(selector)}) !== null"):
            failures.append(f"{page}: nothing matches {selector}")
        png = base64.b64decode(browser.call("Page.captureScreenshot", format="png")["data"])
        (shots / f"{name}.png").write_bytes(png)
        if why := not_blank(png):
            failures.append(f"{page}: screenshot {name}.png {why}")
    return failures


def check_search(browser: Browser, base: str) -> list[str]:
    since = open_page(browser, f"{base}/search.html?q=LayerAdaptiveEWCPlugin")
    deadline, hrefs = time.monotonic() + 30, []
    while time.monotonic() < deadline and not hrefs:
        hrefs = browser.evaluate("[...document.querySelectorAll('#search-results a')].map(a => a.href)") or []
        time.sleep(0.25)
    failures = [f"search.html: {e}" for e in browser.errors(since)]
    if not any("LayerAdaptiveEWCPlugin" in h for h in hrefs):
        failures.append(f"search.html: LayerAdaptiveEWCPlugin not found ({len(hrefs)} results)")
    return failures


def serve(site: Path) -> ThreadingHTTPServer:
    handler = partial(type("Quiet", (SimpleHTTPRequestHandler,), {"log_message": lambda *a: None}),
                      directory=str(site))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)  # a free port, chosen here
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main(argv: list[str]) -> int:
    start = time.perf_counter()
    site = Path(argv[0] if argv else "out/docs/html").resolve()
    if not (site / "index.html").exists():
        sys.exit(f"browser check FAILED: no site at {site} (make docs first)")
    failures = check_links(site)
    n_pages = sum(1 for _ in site.rglob("*.html"))
    shots = site / "_screenshots"
    shots.mkdir(exist_ok=True)
    server, browser = serve(site), Browser(find_chromium())
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        failures += check_pages(browser, base, shots) + check_search(browser, base)
    finally:
        browser.close()
        server.shutdown()
        server.server_close()
    for failure in failures:
        print("FAIL", failure)
    names = ", ".join(sorted(p.name for p in shots.glob("*.png")))
    print(f"browser check: {n_pages} pages, internal links of all checked, screenshots in "
          f"{shots} ({names}); {len(failures)} failure(s); {time.perf_counter() - start:.1f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
