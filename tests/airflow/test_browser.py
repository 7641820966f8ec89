"""What a person sees: headless Chromium (Debian's ``chromium``, driven by playwright, no browser
download) logs in to the real Airflow UI, opens af-backfill's grid and its Primus tab, and reads
the view as drawn: one chart point per trained window, the windows table, the DTGG.

Screenshots go to ``$PRIMUS_TEST_OUTPUT/screenshots`` (default ``.primus/test-output/screenshots``); the
test prints their paths."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.airflow.test_view import trained  # noqa: F401 - the fixture: windows trained through a backfill
from tests.fixtures._require import missing

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("PRIMUS_CHROMIUM", "/usr/bin/chromium")
TIMEOUT_MS = 60_000


def screenshots_dir() -> Path:
    base = os.environ.get("PRIMUS_TEST_OUTPUT")
    target = Path(base) / "screenshots" if base else ROOT / ".primus" / "test-output" / "screenshots"
    target.mkdir(parents=True, exist_ok=True)
    return target


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium, or a failure under CI naming the install step."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing("the python package playwright is not installed (make install: it is in requirements/lock.txt)")
    if not (Path(CHROMIUM).exists() or shutil.which(CHROMIUM)):
        missing(f"{CHROMIUM} not found: install Debian's chromium (scripts/install-system.sh, `make system`)")
    with sync_playwright() as playwright:
        # --no-sandbox: Chromium refuses its sandbox as root (CI containers)
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        try:
            yield chromium
        finally:
            chromium.close()


def test_a_person_sees_the_primus_view_of_the_trained_windows(trained, browser, capsys):  # noqa: F811
    from playwright.sync_api import expect

    server, out = trained.server, screenshots_dir()
    windows = sorted(key.split("/", 1)[1] for key in trained.consumed)
    page = browser.new_page(viewport={"width": 1500, "height": 1100})
    page.set_default_timeout(TIMEOUT_MS)
    expect.set_options(timeout=TIMEOUT_MS)  # expect waits 5 s by default; the grid can take longer
    shots = []

    # log in through the simple auth manager's form, as a person does
    page.goto(f"{server.url}/")
    page.wait_for_url("**/auth/login**")
    page.locator("input[name=username]").fill("admin")
    page.locator("input[name=password]").fill(server.password)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(lambda url: "/auth/login" not in url)
    assert any(c["name"] == "_token" for c in page.context.cookies())  # the UI's session: the JWT cookie

    # the DAG's grid: its runs and tasks
    page.goto(f"{server.url}/dags/af-backfill")
    expect(page.get_by_text("train", exact=True).first).to_be_visible()
    page.wait_for_timeout(1500)  # let the grid draw its run bars before the picture
    shots.append(_shot(page, out / "airflow-grid.png"))

    # the Primus tab of the DAG: the view in the UI's frame
    page.get_by_text("Primus", exact=True).first.click()
    page.wait_for_url("**/dags/af-backfill/plugin/primus")
    frame = page.frame_locator('iframe[title="Primus"]')
    expect(frame.locator("body[data-loaded=true]")).to_have_count(1)
    _check_view(frame, windows)
    shots.append(_shot(page, out / "airflow-primus-tab.png"))

    # the same page alone, full length (the frame shows its top)
    page.goto(f"{server.url}/primus/ui/af-backfill")
    expect(page.locator("body[data-loaded=true]")).to_have_count(1)
    _check_view(page, windows)
    shots.append(_shot(page, out / "primus-view.png", full_page=True))
    page.close()

    with capsys.disabled():
        for shot in shots:
            print(f"\nscreenshot: {shot}")


def _check_view(root, windows: list[str]) -> None:
    """What the page shows: one AUC and one logloss point per trained window, those windows
    marked trained in the table, the trainer facts, the executors chart and the DTGG."""
    from playwright.sync_api import expect

    expect(root.locator("#title")).to_have_text("Primus job af-backfill")
    for chart in ("#auc-chart", "#logloss-chart"):
        points = root.locator(f"{chart} circle.point")
        expect(points).to_have_count(len(windows))
        assert sorted(points.nth(i).get_attribute("data-x") for i in range(len(windows))) == windows
    for window in windows:
        expect(root.locator(f'#windows tr[data-window="{window}"]')).to_have_attribute("data-state", "trained")
        expect(root.locator(f'#windows tr[data-window="{window}"] .badge.success')).to_have_count(1)  # its run
    expect(root.locator("#trainer dd").first).to_be_visible()
    expect(root.locator('.executors-chart[data-role="data_executor"] svg')).to_have_count(1)
    expect(root.locator("#dtgg-svg g.node")).to_have_count(8)  # timer, 2 sources, 2 task sets, join, sink, trainer
    expect(root.locator("#mermaid")).to_contain_text("flowchart LR")


def _shot(page, path: Path, full_page: bool = False) -> Path:
    page.screenshot(path=str(path), full_page=full_page)
    assert path.stat().st_size > 0
    return path
