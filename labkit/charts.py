"""Chart export: every figure goes to HTML (always) and PNG (when kaleido finds a browser).

PNG export needs Chrome/Chromium for kaleido; without one we note it once and keep going, so charts never
make a run fail. On Debian, `apt-get install chromium` is enough (kaleido finds /usr/bin/chromium).
"""

from __future__ import annotations

import atexit
import os
import shutil
import warnings
from pathlib import Path

_PNG_UNAVAILABLE: str | None = None
_SERVER_STARTED = False


def _browser_path() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome"):
        p = shutil.which(name)
        if p:
            return p
    return None


def png_available() -> bool:
    """True when kaleido can render PNGs here (a Chrome/Chromium binary is on PATH or configured)."""
    return _PNG_UNAVAILABLE is None and (_browser_path() is not None or "BROWSER_PATH" in os.environ)


def _png_server() -> None:
    """Keep one browser for every PNG of this process (kaleido's sync server): a chart then takes ~0.7 s
    instead of ~2.5 s for a fresh Chromium each time, which is most of a notebook's export time."""
    global _SERVER_STARTED
    if _SERVER_STARTED:
        return
    _SERVER_STARTED = True
    try:
        import kaleido

        if hasattr(kaleido, "start_sync_server"):
            kaleido.start_sync_server(silence_warnings=True)
            atexit.register(kaleido.stop_sync_server)
    except Exception:  # noqa: BLE001, S110 - older kaleido: one browser per chart, as before
        pass


def save_figure(fig, out_dir: str | Path, name: str, *, png: bool = True) -> list[Path]:
    """Write fig as <out_dir>/<name>.html (self-contained) and, where possible, <name>.png. Returns the paths."""
    global _PNG_UNAVAILABLE
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.html"]
    # plotly.js from its CDN keeps each chart ~10 kB (run folders travel and are committed);
    # LAB_PLOTLY_INLINE=1 embeds it (4.6 MB per chart) for viewing offline.
    fig.write_html(paths[0], include_plotlyjs=True if os.environ.get("LAB_PLOTLY_INLINE") else "cdn")
    if png and png_available():
        browser = _browser_path()
        if browser and "BROWSER_PATH" not in os.environ:
            os.environ["BROWSER_PATH"] = browser
        try:
            _png_server()
            with warnings.catch_warnings():  # "kopts ignored when using a server": the browser path is set above
                warnings.simplefilter("ignore", UserWarning)
                fig.write_image(out / f"{name}.png", scale=2)
            paths.append(out / f"{name}.png")
        except Exception as e:  # kaleido/browser trouble must not fail a run
            _PNG_UNAVAILABLE = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
            warnings.warn(f"PNG export disabled ({_PNG_UNAVAILABLE}); HTML charts are still written", stacklevel=2)
    return paths
