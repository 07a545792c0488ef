"""Drives the web console in a real browser: Debian's chromium, through Playwright's
Python package (`executable_path`, so Playwright downloads no browser of its own).

Run by `tests/ui.rs` (`the_console_shows_the_servers_and_their_leader_in_a_real_browser`),
which starts the server and passes what the page must show as one JSON argument:

    {"base": "http://127.0.0.1:PORT", "chromium": "/usr/bin/chromium",
     "screenshot": "/path/servers.png", "screenshot_dark": "/path/servers-dark.png",
     "admin": {"username": ..., "password": ...}, "user": {"username": ..., "password": ...},
     "leader": "test-server", "fencing_token": 1, "scheduling_mode": "local",
     "server_url": "http://..."}

It fails (an uncaught exception, exit status 1) on the first thing that is not as
expected, and on any console error or uncaught page error, which is how chromium reports
what the Content-Security-Policy blocked.
"""

import json
import re
import sys

from playwright.sync_api import expect, sync_playwright

# Long enough for a loaded 2-core machine; a working page answers in well under a second.
TIMEOUT_MS = 15_000


def log_in(page, base, account):
    page.goto(base + "/#/servers")
    page.locator("input[name=username]").fill(account["username"])
    page.locator("input[name=password]").fill(account["password"])
    page.get_by_role("button", name="Log in").click()
    expect(page.locator("header.topbar")).to_be_visible()


def log_out(page):
    page.locator("header.topbar").get_by_role("button", name="Log out").click()
    expect(page.locator("input[name=username]")).to_be_visible()


def check_servers_as_admin(page, expected):
    nav = page.locator("nav.nav")
    expect(nav.get_by_role("link", name="Servers")).to_be_visible()
    # The login started at #/servers, so the admin lands on the servers screen.
    expect(page).to_have_title("Servers · gantry")
    expect(nav.locator("a.active")).to_have_text("Servers")

    facts = page.locator("[data-cluster]")
    expect(facts.locator("[data-fact=scheduling-mode]")).to_have_text(expected["scheduling_mode"])
    expect(facts.locator("[data-fact=leader]")).to_have_text(expected["leader"])
    expect(facts.locator("[data-fact=fencing-token]")).to_have_text(str(expected["fencing_token"]))

    rows = page.locator("tbody tr[data-server]")
    expect(rows).to_have_count(1)
    row = page.locator(f'tr[data-server="{expected["leader"]}"]')
    expect(row).to_have_class("leader")
    expect(row.locator("[data-role]")).to_have_text("leader")
    expect(row).to_contain_text(expected["server_url"])
    expect(row).to_contain_text("active")
    # The heartbeat the server sent at start-up, shown relative to now.
    expect(row.locator("td").nth(4)).to_have_text(re.compile(r"^(just now|\d+ s ago)$"))
    # The leader's row is marked by the stylesheet, not only by its badge.
    marker = row.locator("td").first.evaluate("td => getComputedStyle(td).boxShadow")
    assert marker != "none", f"the leader's row has no marker: box-shadow {marker!r}"


def check_a_standby_joins(page, base, expected):
    """A second server registered through the API (as the page's own session) appears at
    the next refresh, below the leader and without its mark."""
    response = page.request.post(
        base + "/api/v1/coordinator/servers/register",
        data={"server_id": "standby-1", "url": "http://10.0.0.2:8080", "version": "0.0.0"},
    )
    assert response.status == 201, f"{response.status} {response.text()}"
    rows = page.locator("tbody tr[data-server]")
    expect(rows).to_have_count(2)
    expect(rows.nth(0)).to_have_attribute("data-server", expected["leader"])
    standby = rows.nth(1)
    expect(standby).to_have_attribute("data-server", "standby-1")
    expect(standby.locator("[data-role]")).to_have_text("standby")
    expect(standby).not_to_have_class("leader")
    expect(standby).to_contain_text("http://10.0.0.2:8080")
    facts = page.locator("[data-cluster]")
    expect(facts.locator("[data-fact=leader]")).to_have_text(expected["leader"])
    expect(facts).to_contain_text("2 of 2")


def check_no_servers_for_users(page, base):
    nav = page.locator("nav.nav")
    expect(nav.get_by_role("link", name="Models")).to_be_visible()
    expect(nav.get_by_role("link", name="Servers")).to_have_count(0)
    # Asking for the screen by URL shows the overview instead.
    page.goto(base + "/#/servers")
    expect(page).to_have_title("Overview · gantry")
    expect(page.locator("[data-cluster]")).to_have_count(0)


def main():
    expected = json.loads(sys.argv[1])
    base = expected["base"]
    problems = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=expected["chromium"])
        try:
            context = browser.new_context(viewport={"width": 1360, "height": 640})
            context.set_default_timeout(TIMEOUT_MS)
            expect.set_options(timeout=TIMEOUT_MS)
            page = context.new_page()
            page.on(
                "console",
                lambda message: problems.append(f"console {message.type}: {message.text}")
                if message.type == "error"
                else None,
            )
            page.on("pageerror", lambda error: problems.append(f"page error: {error}"))

            log_in(page, base, expected["admin"])
            check_servers_as_admin(page, expected)
            check_a_standby_joins(page, base, expected)
            page.screenshot(path=expected["screenshot"], full_page=True)
            # The stylesheet swaps its colours for a dark system theme: look at that too.
            page.emulate_media(color_scheme="dark")
            page.screenshot(path=expected["screenshot_dark"], full_page=True)
            page.emulate_media(color_scheme="light")
            log_out(page)

            log_in(page, base, expected["user"])
            check_no_servers_for_users(page, base)
        finally:
            browser.close()
    # A refused session is logged as a failed resource load (401), which is expected
    # before logging in; anything else is a fault of the page.
    problems = [p for p in problems if "status of 401" not in p]
    assert not problems, "the page reported problems:\n" + "\n".join(problems)
    print("browser checks passed; screenshots at", expected["screenshot"], expected["screenshot_dark"])


if __name__ == "__main__":
    main()
