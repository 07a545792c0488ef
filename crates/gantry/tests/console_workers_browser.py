"""The console's workers, guards, navigation and theme, in a real browser (Debian's
chromium through Playwright's Python package, `executable_path`: no browser download),
against a real `gantry start` with a simulated 24 GiB GPU and a real llama-server.

Run by `tests/e2e/console_workers.rs`, which passes one JSON argument:

    {"base": "http://127.0.0.1:PORT", "chromium": "/usr/bin/chromium",
     "initial_password": "...", "new_password": "...", "model_path": "/.../tiny.gguf",
     "llama_server": "/.../llama-server", "token": "gantryreg_...",
     "gantry": "/.../gantry", "joined_args": ["--data-dir", ...], "joined_log": "/...",
     "screenshots": {"NAME": PNG, ...}}

Deploy a model; see on the workers list and a worker's page the GPU memory it claims beside
what is in use, the instance placed there and how the worker runs each backend; copy the
join command from "Add a worker" and run it to join a second worker; be refused giving up
the last admin's role, and change another user's role only once confirmed; be warned of
the routes a model deletion affects and of a route target that does not run; find the
screens in groups, through a menu on a phone, where the models, instances and workers
tables keep their key columns; choose the theme. Screenshots at 1440×900 and 390×844. It
fails (exit status 1) on the first thing that is not as expected and on any console error
or uncaught page error, except the refusals it provokes on purpose.
"""

import json
import re
import shlex
import signal
import subprocess
import sys

from playwright.sync_api import expect

from console_session import DESKTOP, PHONE, RUNNING_TIMEOUT_MS, api_call, first_login, run_session, screenshot

DARK_BG = "rgb(18, 21, 27)"
LIGHT_BG = "rgb(245, 246, 248)"


def api(page, expected, method, path, body=None):
    """A call of the management API with the page's session; answers (status, JSON)."""
    return api_call(page, expected["base"], method, path, body)


def deploy(page, expected):
    status, model = api(page, expected, "POST", "/api/v1/models", {
        "name": "tiny-chat", "backend": "llama.cpp", "replicas": 1,
        "backend_args": ["-c", "256", "-t", "1", "-tb", "1", "-np", "1"],
        "source": {"type": "local_path", "path": expected["model_path"]},
    })
    assert status == 201, model
    page.locator("nav a[data-screen=models]").click()
    row = page.locator("tr", has=page.get_by_text("tiny-chat", exact=True))
    expect(row.locator(".badge")).to_have_text("1 / 1", timeout=RUNNING_TIMEOUT_MS)


def navigation_in_groups(page, shots):
    """Three groups down the side at 1440 px, every screen in one, the active one marked."""
    nav = page.locator("nav.nav")
    expect(nav).to_be_visible()
    expect(page.locator(".menu-button")).to_be_hidden()
    expect(nav.locator(".nav-group-title")).to_have_text(["Serve", "Operate", "Access"])
    groups = nav.locator(".nav-group")
    expect(groups.nth(0).locator("a")).to_have_text(["Overview", "Models", "Catalog", "Playground"])
    expect(groups.nth(1).locator("a")).to_have_text(["Instances", "Workers", "Clusters", "Model files", "Servers"])
    expect(groups.nth(2).locator("a")).to_have_text(["API keys", "Users", "Routes", "Providers", "Usage"])
    nav.get_by_role("link", name="Overview").click()
    expect(nav.locator("a.active")).to_have_text("Overview")
    expect(page.locator("[data-gpu-memory=claimed] .num")).not_to_have_text("0 B")
    screenshot(page, shots["nav_desktop"])


def workers_list(page, expected, shots):
    """Claimed beside in use on the list; the backends with how they run; the join
    command, copied and run, joins a second worker."""
    page.locator("nav a[data-screen=workers]").click()
    row = page.locator("table[data-workers] tbody tr").first
    gpu = row.locator("[data-gpu='0']")
    expect(gpu.locator("[data-gpu-memory=claimed] .num")).not_to_have_text("0 B")
    expect(gpu.locator("[data-gpu-memory='in use'] .num")).to_have_text("0 B")
    expect(gpu).to_contain_text("24.0 GiB")
    chips = row.locator("[data-backends]")
    expect(chips.locator("[data-backend='llama.cpp']")).to_have_text("llama.cpp · found")
    expect(chips.locator("[data-backend='llama.cpp']")).to_have_attribute("title", re.compile(re.escape(expected["llama_server"])))
    expect(chips.locator("[data-backend='vllm']")).to_have_text("vllm · on first use")
    expect(chips.locator("[data-backend='custom']")).to_have_text("custom")

    # Add a worker: folded while there are workers; the exact command, copied.
    join = page.locator("[data-join]")
    command = join.locator("[data-join-command]")
    expect(command).to_be_hidden()
    join.locator("summary").click()
    want = f"gantry worker --server-url {expected['base']} --token {expected['token']}"
    expect(command).to_have_text(want)
    join.get_by_role("button", name="Copy").click()
    expect(join.get_by_role("button", name="Copied")).to_be_visible()
    copied = page.evaluate("navigator.clipboard.readText()")
    assert copied == want, f"the clipboard holds {copied!r}"
    screenshot(page, shots["workers_join"])

    # The copied command, run as it is on "another machine", joins.
    args = shlex.split(copied)
    assert args[:2] == ["gantry", "worker"], args
    with open(expected["joined_log"], "w") as log:
        worker = subprocess.Popen([expected["gantry"]] + args[1:] + expected["joined_args"],
                                  stdout=log, stderr=subprocess.STDOUT)
    try:
        joined = page.locator("tr[data-worker=joined]")
        expect(joined.locator(".badge").first).to_have_text("ready", timeout=30_000)
        # Nothing configured and nothing on PATH: llama.cpp would be installed on first use.
        expect(joined.locator("[data-backend='llama.cpp']")).to_have_text("llama.cpp · on first use")
        expect(joined.locator("[data-gpu-memory=claimed] .num")).to_have_text("0 B")
        screenshot(page, shots["workers_two"])
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0, "the joined worker did not stop cleanly"
    joined.get_by_role("button", name="Delete").click()
    page.locator("dialog").get_by_role("button", name="Delete worker").click()
    expect(joined).to_have_count(0)


def worker_page(page, expected, shots):
    """A worker's page: GPU claims, the instance placed there, the backends."""
    page.locator("table[data-workers] tbody tr").first.locator("a[href^='#/workers/']").click()
    expect(page.locator("h1")).to_contain_text("Worker ")
    gpus = page.locator("[data-worker-gpus] [data-gpu='0']")
    expect(gpus.locator("[data-gpu-memory=claimed] .num")).not_to_have_text("0 B")
    expect(gpus.locator("[data-gpu-memory='in use'] .num")).to_have_text("0 B")
    instance = page.locator("[data-worker-instances] tr[data-instance='tiny-chat-0']")
    expect(instance).to_contain_text("tiny-chat")
    expect(instance.locator(".badge")).to_have_text("running")
    expect(instance.locator("[data-part=gpus]")).to_have_text(re.compile(r"^#0 \d"))
    ways = page.locator("[data-backend-ways]")
    expect(ways.locator("tr[data-backend='llama.cpp']")).to_contain_text("found")
    expect(ways.locator("tr[data-backend='llama.cpp']")).to_contain_text(expected["llama_server"])
    expect(ways.locator("tr[data-backend='vllm']")).to_contain_text("installed on first use")
    expect(ways.locator("tr[data-backend='custom']")).to_contain_text("runs the command each model gives")
    expect(page.locator("[data-installed-backends]")).to_contain_text("gantry has installed no backend versions here yet")
    # The first sample comes with a heartbeat; the page reads the history every 10 s.
    expect(page.locator("[data-history-chart='GPU memory used']")).to_be_visible(timeout=40_000)
    expect(page.locator("[data-chart-note]")).to_contain_text("simulated GPUs report none in use")
    screenshot(page, shots["worker"])
    page.set_viewport_size(PHONE)
    expect(instance.locator(".badge")).to_be_in_viewport()
    screenshot(page, shots["worker_phone"])
    page.set_viewport_size(DESKTOP)


def within_width(locator, width):
    box = locator.bounding_box()
    assert box is not None, f"{locator} is not shown"
    assert box["x"] >= 0 and box["x"] + box["width"] <= width, f"{locator} lies at {box}, beyond {width} px"


def phone(page, expected, shots):
    """At 390 px: a menu instead of the sidebar, and tables that keep their key columns."""
    page.set_viewport_size(PHONE)
    page.goto(expected["base"] + "/#/models")
    nav = page.locator("nav.nav")
    menu = page.locator(".menu-button")
    expect(menu).to_be_visible()
    expect(menu).to_contain_text("Models")
    expect(nav).to_be_hidden()
    row = page.locator("tr", has=page.get_by_text("tiny-chat", exact=True))
    expect(row.locator(".badge")).to_have_text("1 / 1")
    for key in (row.get_by_text("tiny-chat", exact=True), row.locator(".badge"),
                row.get_by_role("link", name="Chat", exact=True), row.get_by_role("button", name="Edit", exact=True),
                row.get_by_role("button", name="Delete", exact=True)):
        expect(key).to_be_visible()
        within_width(key, PHONE["width"])
    for secondary in ("Backend", "Source", "Backend args", "Created"):
        expect(page.locator("thead th", has_text=re.compile("^" + secondary + "$"))).to_be_hidden()
    screenshot(page, shots["models_phone"])

    menu.click()
    expect(nav).to_be_visible()
    expect(nav.locator(".nav-group-title")).to_have_text(["Serve", "Operate", "Access"])
    expect(nav.locator("[data-theme-choice]")).to_have_count(3)
    screenshot(page, shots["menu_phone"])
    nav.get_by_role("link", name="Instances").click()
    expect(nav).to_be_hidden()
    expect(page.locator("h1")).to_have_text("Instances")
    instance = page.locator("tr[data-instance]").first
    for key in (instance.get_by_text("tiny-chat-0", exact=True), instance.locator(".badge"),
                instance.get_by_role("link", name="Logs"), instance.get_by_role("button", name="Restart")):
        expect(key).to_be_visible()
        within_width(key, PHONE["width"])
    screenshot(page, shots["instances_phone"])

    menu.click()
    nav.get_by_role("link", name="Workers").click()
    worker = page.locator("table[data-workers] tbody tr").first
    for key in (worker.locator("a[href^='#/workers/']"), worker.locator(".badge").first,
                worker.get_by_role("button", name="Labels"), worker.get_by_role("button", name="Delete")):
        expect(key).to_be_visible()
        within_width(key, PHONE["width"])
    # Escape closes an open menu.
    menu.click()
    expect(nav).to_be_visible()
    page.keyboard.press("Escape")
    expect(nav).to_be_hidden()
    screenshot(page, shots["workers_phone"])
    page.set_viewport_size(DESKTOP)


def users(page, expected, shots):
    """The last admin's role stays, with a sentence; another's changes once confirmed."""
    status, bob = api(page, expected, "POST", "/api/v1/users",
                      {"username": "bob", "password": "bob-password-1", "require_password_change": False})
    assert status == 201, bob
    page.locator("nav a[data-screen=users]").click()
    mine = page.get_by_label("Role of admin")
    expect(mine).to_have_value("admin")
    mine.select_option("user")
    dialog = page.locator("dialog")
    expect(dialog.get_by_role("heading")).to_have_text("Give up your admin role?")
    dialog.get_by_role("button", name="Make user").click()
    expect(dialog.get_by_role("alert")).to_have_text(
        "You are the last admin, so you cannot give up the role. Make another user an admin first.")
    screenshot(page, shots["last_admin"])
    dialog.get_by_role("button", name="Cancel").click()
    expect(dialog).to_have_count(0)
    expect(mine).to_have_value("admin")
    assert api(page, expected, "GET", "/auth/me")[1]["role"] == "admin"

    theirs = page.get_by_label("Role of bob")
    theirs.select_option("admin")
    expect(dialog.get_by_role("heading")).to_have_text("Make bob an admin?")
    dialog.get_by_role("button", name="Cancel").click()
    expect(theirs).to_have_value("user")
    assert api(page, expected, "GET", f"/api/v1/users/{bob['id']}")[1]["role"] == "user"
    theirs.select_option("admin")
    expect(dialog.get_by_role("heading")).to_have_text("Make bob an admin?")
    screenshot(page, shots["role_confirm"])
    dialog.get_by_role("button", name="Make admin").click()
    expect(page.locator(".toast", has_text="bob is now an admin.")).to_be_visible()
    expect(page.get_by_label("Role of bob")).to_have_value("admin")
    assert api(page, expected, "GET", f"/api/v1/users/{bob['id']}")[1]["role"] == "admin"


def routes(page, expected, shots):
    """A route to a model with no running instance is accepted, with a warning."""
    status, idle = api(page, expected, "POST", "/api/v1/models", {
        "name": "tiny-idle", "backend": "llama.cpp", "replicas": 0,
        "source": {"type": "local_path", "path": expected["model_path"]},
    })
    assert status == 201, idle
    page.locator("nav a[data-screen=routes]").click()
    page.get_by_role("button", name="New route").click()
    form = page.locator("form[data-route-form='']")
    warning = form.locator("[data-route-warning]")
    form.get_by_role("textbox", name=re.compile(r"^Name")).fill("idle-only")
    form.locator("[data-target-row='0']").get_by_label("Deployed model").select_option("tiny-idle")
    expect(warning).to_have_text(
        "tiny-idle has no running instance: the route answers through it only once it runs. "
        "Until then, clients calling idle-only get errors.")
    form.locator("[data-target-row='0']").get_by_label("Deployed model").select_option("tiny-chat")
    expect(warning).to_be_hidden()
    form.get_by_role("textbox", name=re.compile(r"^Name")).fill("chat")
    form.get_by_role("button", name="Add target").click()
    form.locator("[data-target-row='1']").get_by_label("Deployed model").select_option("tiny-idle")
    expect(warning).to_have_text("tiny-idle has no running instance: the route answers through it only once it runs.")
    screenshot(page, shots["route_idle_warning"])
    form.get_by_role("button", name="Create route").click()
    expect(page.locator(".toast", has_text="Route chat created: it answers through each target once that one runs.")).to_be_visible()
    expect(page.locator("[data-route=chat] [data-target]")).to_have_count(2)


def delete_models(page, expected, shots):
    """Deleting a model a route targets names the route, and says what becomes of it."""
    page.locator("nav a[data-screen=models]").click()
    row = page.locator("tr", has=page.get_by_text("tiny-chat", exact=True))
    row.get_by_role("button", name="Delete").click()
    dialog = page.locator("dialog")
    warning = dialog.locator("[data-route-warning]")
    expect(warning).to_contain_text("A route sends requests to tiny-chat:")
    expect(warning.locator("li[data-route=chat]")).to_have_text("chat — its other targets answer instead.")
    screenshot(page, shots["delete_model_warning"])
    dialog.get_by_role("button", name="Delete model").click()
    expect(row).to_have_count(0)
    row = page.locator("tr", has=page.get_by_text("tiny-idle", exact=True))
    row.get_by_role("button", name="Delete").click()
    expect(warning.locator("li[data-route=chat]")).to_have_text(
        "chat — none of its other targets is deployed: its clients get errors until a model of this name runs again.")
    dialog.get_by_role("button", name="Delete model").click()
    expect(page.get_by_text("No models yet.", exact=False)).to_be_visible()
    # A model no route targets is deleted without a warning.
    status, _ = api(page, expected, "POST", "/api/v1/models", {
        "name": "tiny-alone", "backend": "llama.cpp", "replicas": 0,
        "source": {"type": "local_path", "path": expected["model_path"]},
    })
    assert status == 201
    row = page.locator("tr", has=page.get_by_text("tiny-alone", exact=True))
    row.get_by_role("button", name="Delete").click()
    expect(dialog.get_by_role("heading")).to_have_text("Delete tiny-alone?")
    expect(dialog.locator("[data-route-warning]")).to_have_count(0)
    dialog.get_by_role("button", name="Delete model").click()
    expect(row).to_have_count(0)


def background(page):
    return page.evaluate("getComputedStyle(document.body).backgroundColor")


def theme(page, expected, shots):
    """System by default; Dark and Light chosen override it and outlive a reload."""
    nav = page.locator("nav.nav")
    page.emulate_media(color_scheme="dark")
    expect(nav.locator("[data-theme-choice=system]")).to_have_attribute("aria-pressed", "true")
    assert background(page) == DARK_BG, background(page)
    nav.locator("[data-theme-choice=light]").click()
    expect(page.locator("html")).to_have_attribute("data-theme", "light")
    assert background(page) == LIGHT_BG, background(page)
    screenshot(page, shots["light_chosen"])
    page.emulate_media(color_scheme="light")
    nav.locator("[data-theme-choice=dark]").click()
    expect(nav.locator("[data-theme-choice=dark]")).to_have_attribute("aria-pressed", "true")
    assert background(page) == DARK_BG, background(page)
    page.reload()
    expect(page.locator("header.topbar")).to_be_visible()
    expect(page.locator("html")).to_have_attribute("data-theme", "dark")
    expect(nav.locator("[data-theme-choice=dark]")).to_have_attribute("aria-pressed", "true")
    assert background(page) == DARK_BG, background(page)
    page.locator("nav a[data-screen=workers]").click()
    expect(page.locator("table[data-workers]")).to_be_visible()
    screenshot(page, shots["dark_desktop"])
    page.set_viewport_size(PHONE)
    page.locator(".menu-button").click()
    screenshot(page, shots["dark_phone"])
    page.keyboard.press("Escape")
    page.set_viewport_size(DESKTOP)
    nav.locator("[data-theme-choice=system]").click()
    expect(page.locator("html")).not_to_have_attribute("data-theme", re.compile(".*"))
    assert background(page) == LIGHT_BG, background(page)
    assert page.evaluate("localStorage.getItem('gantry.theme')") is None


def main():
    expected = json.loads(sys.argv[1])
    shots = expected["screenshots"]

    def steps(page):
        first_login(page, expected)
        deploy(page, expected)
        navigation_in_groups(page, shots)
        workers_list(page, expected, shots)
        worker_page(page, expected, shots)
        phone(page, expected, shots)
        users(page, expected, shots)
        routes(page, expected, shots)
        delete_models(page, expected, shots)
        theme(page, expected, shots)

    # Giving up the last admin's role is refused on purpose (409).
    run_session(
        expected,
        steps,
        on_purpose=lambda p: "status of 409" in p and p.endswith("/api/v1/users/1"),
        clipboard=True,
    )
    print("console workers checks passed")


if __name__ == "__main__":
    main()
