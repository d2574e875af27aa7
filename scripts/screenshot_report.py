"""Open a numdev report in headless Chromium and save a screenshot: the page as a reader sees it.

    python scripts/screenshot_report.py [outputs/report/index.html] [-o screenshot.png]

Prints JSON: the browser used, the screenshot's size, and how much of it is not background (a
blank or broken page reads near 0), how many of the page's images the browser decoded, and which
of the report's marked sections the rendered page has (MARKERS: the HTML ids numdev-report gives
them: the provenance header, the study's loss curves and sample grids). --require ID ... exits 1
when one of them is missing. Needs chromium (or google-chrome) on PATH: `apt install chromium` on
Debian/Ubuntu.
"""

from __future__ import annotations

import numdev.cli.script_entry  # noqa: F401  (first: Ctrl-C while the imports below load exits 130 in one line)

import json
import shutil
import subprocess
import sys
from pathlib import Path

from numdev.cli.script_args import ScriptParser, run_script
from numdev.runs.scratch import scratch

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
# The stable section ids of a numdev report (numdev/report/provenance.py ANCHOR, report/study.py).
MARKERS = ("provenance", "loss-curves", "samples", "the-answer", "legend")  # the-answer, legend: numdev.report.html


def find_browser() -> str | None:
    return next((path for name in BROWSERS if (path := shutil.which(name))), None)


def screenshot(page: Path, out: Path, width: int = 1200, height: int = 9000, markers=MARKERS) -> dict:
    browser = find_browser()
    if browser is None:
        raise FileNotFoundError(f"no headless browser found (tried {', '.join(BROWSERS)}): install chromium")
    if not page.is_file():
        raise FileNotFoundError(f"{page} does not exist: run numdev-report first")
    out.parent.mkdir(parents=True, exist_ok=True)
    with scratch("numdev_screenshot_report_") as profile:
        command = [
            browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
            f"--user-data-dir={profile}", f"--window-size={width},{height}", f"--screenshot={out}",
            page.resolve().as_uri(),
        ]
        subprocess.run(command, check=True, capture_output=True, timeout=120)
        # The DOM after rendering: how many <img> the browser actually decoded.
        dom = subprocess.run(
            [browser, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={profile}",
             "--virtual-time-budget=5000", "--dump-dom", page.resolve().as_uri()],
            check=True, capture_output=True, text=True, timeout=120,
        ).stdout
    import matplotlib.image

    pixels = matplotlib.image.imread(out)[..., :3]  # (H, W, 3) in [0, 1]
    background = pixels[0, 0]
    not_background = float((abs(pixels - background).sum(axis=-1) > 0.05).mean())
    return {
        "browser": browser,
        "page": str(page),
        "screenshot": str(out),
        "width": int(pixels.shape[1]),
        "height": int(pixels.shape[0]),
        "non_background_fraction": not_background,
        "images_in_dom": dom.count("<img"),
        "sections_in_dom": dom.count("<section"),
        "markers": {marker: _has_id(dom, marker) for marker in markers},
    }


def _has_id(dom: str, marker: str) -> bool:
    return f'id="{marker}"' in dom or f"id='{marker}'" in dom


def main(argv: list[str] | None = None) -> None:
    parser = ScriptParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("page", nargs="?", default="outputs/report/index.html")
    parser.add_argument("-o", "--out", help="PNG path (default: beside the page, screenshot.png)")
    parser.add_argument("--width", type=int, default=1200, help="the window's width in CSS px (default 1200)")
    parser.add_argument("--height", type=int, default=9000, help="the window's height: the screenshot's (default 9000; "
                        "1000 shows what a reader sees first)")
    parser.add_argument("--require", nargs="*", default=[], metavar="ID",
                        help=f"section ids that must be in the rendered page (e.g. {' '.join(MARKERS)})")
    args = parser.parse_args(argv)
    if args.width < 200 or args.height < 200:
        parser.error(f"--width {args.width} --height {args.height}: give at least 200 px each")
    page = Path(args.page)
    try:
        markers = tuple(dict.fromkeys([*MARKERS, *args.require]))
        result = screenshot(page, Path(args.out) if args.out else page.parent / "screenshot.png", width=args.width,
                            height=args.height, markers=markers)
    except (FileNotFoundError, subprocess.SubprocessError) as error:
        sys.exit(f"screenshot_report: error: {error}")
    print(json.dumps(result, indent=2))
    missing = [marker for marker in args.require if not result["markers"][marker]]
    if missing:
        sys.exit(f"screenshot_report: error: the rendered page has no section with id {', '.join(missing)}")


if __name__ == "__main__":
    run_script(main)
