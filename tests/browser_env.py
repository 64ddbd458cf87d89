"""Headless Chromium for the tests, driven over the DevTools protocol
(``--remote-debugging-pipe``): the binary (a skip, or in CI a failure, where it is missing), a
minimal protocol client, the URL schemes a self-contained page may load, and a check that a
screenshot is not blank."""

from __future__ import annotations

import contextlib
import fcntl
import io
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1280,2400",
]
LOCAL_SCHEMES = ("file:", "data:", "about:", "blob:", "chrome:", "devtools:")


def chromium_binary() -> str:
    path = shutil.which("chromium") or (
        "/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None
    )
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(
                "chromium is not installed (CI installs it with `apt-get install -y chromium`)"
            )
        pytest.skip("chromium is not installed (apt-get install -y chromium)")
    return path


class DevTools:
    """A minimal Chrome DevTools Protocol client over ``--remote-debugging-pipe`` (fds 3 and 4,
    NUL-terminated JSON messages): no websocket library, no port."""

    def __init__(self, binary: str, timeout: float = 90.0):
        self.profile = tempfile.mkdtemp(prefix="pe-interp-chromium-")
        cmd_r, self._w = os.pipe()  # we write commands, chromium reads them on fd 3
        self._r, evt_w = os.pipe()  # chromium writes on fd 4
        # Move the child's ends to fds >= 10 so bash's "3<&N 4>&M" can never clobber one with the
        # other, then let bash put them on fds 3 and 4 and exec chromium (no preexec_fn).
        hi_r, hi_w = fcntl.fcntl(cmd_r, fcntl.F_DUPFD, 10), fcntl.fcntl(evt_w, fcntl.F_DUPFD, 10)
        for fd in (cmd_r, evt_w):
            os.close(fd)
        argv = [
            binary,
            *CHROMIUM_FLAGS,
            f"--user-data-dir={self.profile}",
            "--remote-debugging-pipe",
            "about:blank",
        ]
        self.proc = subprocess.Popen(
            ["bash", "-c", f'exec "$@" 3<&{hi_r} 4>&{hi_w} {hi_r}<&- {hi_w}>&-', "bash", *argv],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            pass_fds=(hi_r, hi_w),
        )
        os.close(hi_r)
        os.close(hi_w)
        self.timeout, self.buf, self.next_id, self.events = timeout, b"", 0, []

    def _message(self, deadline: float) -> dict:
        while b"\0" not in self.buf:
            left = deadline - time.time()
            if left <= 0:
                raise TimeoutError
            if select.select([self._r], [], [], left)[0]:
                chunk = os.read(self._r, 1 << 20)
                if not chunk:
                    raise RuntimeError(
                        "chromium exited: "
                        + self.proc.stderr.read().decode(errors="replace")[-2000:]
                    )
                self.buf += chunk
        msg, self.buf = self.buf.split(b"\0", 1)
        return json.loads(msg)

    def call(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        deadline = time.time() + self.timeout
        while True:
            reply = self._message(deadline)
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for(self, method: str | None, seconds: float) -> bool:
        """Collect events until ``method`` arrives (True) or ``seconds`` pass (False)."""
        deadline = time.time() + seconds
        if method and any(e.get("method") == method for e in self.events):
            return True
        try:
            while True:
                e = self._message(deadline)
                self.events.append(e)
                if method and e.get("method") == method:
                    return True
        except TimeoutError:
            return False

    def open(self, path: Path) -> str:
        """A new tab with the Runtime, Log, Network and Page domains on, showing ``path`` once it
        has loaded (events recorded from before the navigation); returns its session id."""
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        sid = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Runtime", "Log", "Network", "Page"):
            self.call(f"{domain}.enable", session=sid)
        self.events.clear()
        self.call("Page.navigate", {"url": Path(path).resolve().as_uri()}, session=sid)
        assert self.wait_for("Page.loadEventFired", 60), "the page never finished loading"
        return sid

    def close(self) -> None:
        with contextlib.suppress(RuntimeError, TimeoutError, OSError):
            self.call("Browser.close")
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._r, self._w):
            os.close(fd)
        self.proc.stderr.close()
        shutil.rmtree(self.profile, ignore_errors=True)


def is_flat(png: bytes) -> bool:
    from PIL import Image

    img = Image.open(io.BytesIO(png)).convert("RGB")
    colors = img.getcolors(maxcolors=1 << 20) or []
    top = max(n for n, _ in colors)
    return len(colors) < 16 or top > 0.995 * img.width * img.height
