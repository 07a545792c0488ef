"""What every console browser script of this crate shares (`console_browser.py`,
`console_failures_browser.py`, `console_playground_browser.py`,
`console_workers_browser.py`): the browser session with the page's problems collected,
the first login with the generated password, screenshots, and calls of the API with the
page's session. Each script's folder is on Python's path when it runs, so they import it
as `console_session`.
"""

import json

from playwright.sync_api import expect, sync_playwright

# Long enough for a loaded 2-core machine; a working page answers in well under a second.
TIMEOUT_MS = 20_000
# A model's start: llama-server loading the tiny model on a busy machine.
RUNNING_TIMEOUT_MS = 90_000
DESKTOP = {"width": 1440, "height": 900}
PHONE = {"width": 390, "height": 844}


def screenshot(page, path, viewport=None):
    """A full-page screenshot from the top (the sticky top bar would otherwise be drawn
    where the page is scrolled to), at `viewport`'s size when one is given (the page is
    then put back at the desktop's)."""
    if viewport:
        page.set_viewport_size(viewport)
        page.wait_for_timeout(300)
    page.evaluate("window.scrollTo(0, 0)")
    page.screenshot(path=path, full_page=True)
    if viewport:
        page.set_viewport_size(DESKTOP)
    print("screenshot", path)


def first_login(page, expected, screenshot_path=None):
    """Logs in as admin with the generated password and replaces it, as the console asks
    before anything else (a screenshot of that form to `screenshot_path`)."""
    page.goto(expected["base"] + "/")
    page.locator("input[name=username]").fill("admin")
    page.locator("input[name=password]").fill(expected["initial_password"])
    page.get_by_role("button", name="Log in").click()
    new = page.locator("input[autocomplete=new-password]")
    expect(new.first).to_be_visible()
    new.nth(0).fill(expected["new_password"])
    new.nth(1).fill(expected["new_password"])
    if screenshot_path:
        screenshot(page, screenshot_path)
    page.get_by_role("button", name="Set password and continue").click()
    expect(page.locator("header.topbar")).to_be_visible()


def api_call(page, base, method, path, body=None):
    """A call of the management API with the page's session: (status, JSON or None)."""
    response = page.request.fetch(
        base + path,
        method=method,
        data=json.dumps(body) if body is not None else None,
        headers={"content-type": "application/json"} if body is not None else {},
    )
    text = response.text()
    return response.status, (json.loads(text) if text else None)


def run_session(expected, steps, on_purpose=lambda problem: False, viewport=None, clipboard=False):
    """Runs `steps(page)` in chromium at `viewport` (the desktop's by default) and fails on
    any console error or uncaught page error, which is how chromium reports what the
    Content-Security-Policy blocked, except the refusals `on_purpose` names and the 401
    of the session check a page makes before logging in."""
    problems = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=expected["chromium"])
        try:
            context = browser.new_context(viewport=viewport or DESKTOP)
            if clipboard:
                context.grant_permissions(["clipboard-read", "clipboard-write"], origin=expected["base"])
            context.set_default_timeout(TIMEOUT_MS)
            expect.set_options(timeout=TIMEOUT_MS)
            page = context.new_page()
            page.on(
                "console",
                lambda message: problems.append(
                    f"console {message.type}: {message.text} at {message.location.get('url', '')}"
                )
                if message.type == "error"
                else None,
            )
            page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
            steps(page)
        finally:
            browser.close()
    problems = [p for p in problems if "status of 401" not in p and not on_purpose(p)]
    assert not problems, "the page reported problems:\n" + "\n".join(problems)
