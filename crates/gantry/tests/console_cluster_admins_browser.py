"""The console of a cluster administrator (a user who is not an admin), in a real browser
(Debian's chromium through Playwright's Python package, `executable_path`: no browser
download), against a real `gantry start` with a simulated 24 GiB GPU and a real
llama-server.

Run by `tests/e2e/console_cluster_admins.rs`, which passes one JSON argument:

    {"base": "http://127.0.0.1:PORT", "chromium": "/usr/bin/chromium",
     "initial_password": "...", "new_password": "...", "model_path": "/.../tiny.gguf",
     "gantry": "/.../gantry", "joined_args": ["--data-dir", ...], "joined_log": "/...",
     "screenshots": {"NAME": PNG, ...}}

The admin makes a cluster "east", joins a second worker to it with its join command, and
makes "dana", who administers east, and "paul", a plain user (API calls). Dana sees the
Clusters and Workers screens with east and its worker only, no join command, token,
rotation or cluster and pool actions, labels a worker, and deploys a model into east from
the New model form (whose cluster select holds east only, chosen); it runs there, and she
may edit, delete and restart it. Once the admin gives her another cluster instead, saving
the worker's labels is refused and the dialog shows the server's sentence. Paul sees no
Clusters or Workers entries and no New model. Screenshots at 1440×900 and 390×844.
It fails (exit status 1) on the first thing that is not as expected and on any console
error or uncaught page error, except the refusal it provokes on purpose.
"""

import json
import re
import shlex
import signal
import subprocess
import sys
import time

from playwright.sync_api import expect

from console_session import DESKTOP, PHONE, RUNNING_TIMEOUT_MS, api_call, first_login, run_session, screenshot

DANA = ("dana", "dana-password-1")
PAUL = ("paul", "paul-password-1")


def api(page, expected, method, path, body=None):
    """A call of the management API with the page's session; answers (status, JSON)."""
    return api_call(page, expected["base"], method, path, body)


def go(page, route):
    """Opens a screen by its address, as a bookmark or a link would."""
    page.evaluate("route => { location.hash = route; }", "#/" + route)


def quiet(page):
    """Waits for the toasts to go: on a phone they cover what a screenshot is of."""
    expect(page.locator(".toast")).to_have_count(0, timeout=10_000)


def eventually(what, check, seconds=40):
    """Waits until `check()` answers a true value, and answers it."""
    deadline = time.monotonic() + seconds
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"waited {seconds} s for {what}"
        time.sleep(0.5)


def set_up(page, expected):
    """As the admin: the cluster east, a worker joined to it with its command, and the
    users. Answers (east's id, east-1's id, the worker's process)."""
    status, east = api(page, expected, "POST", "/api/v1/clusters", {"name": "east"})
    assert status == 201, east
    status, registration = api(page, expected, "GET", f"/api/v1/clusters/{east['id']}/registration-token")
    assert status == 200, registration
    args = shlex.split(registration["command"])
    with open(expected["joined_log"], "w") as log:
        worker = subprocess.Popen([expected["gantry"]] + args[1:] + expected["joined_args"],
                                  stdout=log, stderr=subprocess.STDOUT)

    def ready():
        status, workers = api(page, expected, "GET", f"/api/v1/workers?cluster_id={east['id']}")
        assert status == 200, workers
        return next((w["id"] for w in workers["items"] if w["state"] == "ready"), None)
    worker_id = eventually("east-1 to be ready", ready)
    for (username, password), clusters in ((DANA, [east["id"]]), (PAUL, [])):
        status, user = api(page, expected, "POST", "/api/v1/users",
                           {"username": username, "password": password, "cluster_admin_of": clusters})
        assert status == 201, user
    return east["id"], worker_id, worker


def log_in_as(page, expected, user):
    """Logs out whoever is logged in and logs `user` in through the login form."""
    page.get_by_role("button", name="Log out").click()
    page.locator("input[name=username]").fill(user[0])
    page.locator("input[name=password]").fill(user[1])
    page.get_by_role("button", name="Log in").click()
    expect(page.locator("header.topbar")).to_contain_text(user[0])


def clusters(page, cluster_id, shots):
    """Dana's clusters: east alone, without the admins' actions; its page without the join
    command, the token or its rotation, and its pools without their actions."""
    operate = page.locator("nav.nav .nav-group").nth(1)
    expect(operate.locator("a")).to_have_text(["Instances", "Workers", "Clusters"])
    page.locator("nav a[data-screen=clusters]").click()
    expect(page.locator("h1")).to_have_text("Clusters")
    rows = page.locator("table[data-clusters] tbody tr")
    expect(rows).to_have_count(1)
    east = page.locator("tr[data-cluster=east]")
    expect(east.locator("[data-part=workers]")).to_have_text("1 / 1")
    expect(page.get_by_role("button", name="New cluster")).to_have_count(0)
    for name in ("Edit", "Delete"):
        expect(east.get_by_role("button", name=name)).to_have_count(0)
    expect(east.get_by_role("link", name="Join")).to_have_count(0)
    quiet(page)
    screenshot(page, shots["clusters"])
    screenshot(page, shots["clusters_phone"], PHONE)

    east.get_by_role("link", name="Open").click()
    expect(page.locator("h1")).to_have_text("Cluster east")
    expect(page).to_have_url(re.compile(rf"#/clusters/{cluster_id}$"))
    expect(page.locator("[data-fact=workers]")).to_contain_text("1 of 1")
    pools = page.locator("[data-pools]")
    expect(pools.locator(".pools-empty")).to_contain_text("No worker pools")
    expect(pools.get_by_role("button", name="New pool")).to_have_count(0)
    expect(page.locator("[data-cluster-join]")).to_have_count(0)
    expect(page.locator("[data-join-command]")).to_have_count(0)
    expect(page.get_by_role("button", name="Rotate token")).to_have_count(0)
    expect(page.locator(".page-head").get_by_role("button")).to_have_count(0)
    assert "gantryreg_" not in page.content(), "a cluster administrator's page shows a registration token"
    screenshot(page, shots["cluster_page"])


def workers(page, shots):
    """Dana's workers: east-1 alone, its labels changed; no Delete, no join box."""
    page.locator("nav a[data-screen=workers]").click()
    expect(page.locator("h1")).to_have_text("Workers")
    rows = page.locator("table[data-workers] tbody tr")
    expect(rows).to_have_count(1)
    row = page.locator("tr[data-worker=east-1]")
    expect(row.locator(".badge").first).to_have_text("ready")
    expect(page.locator("[data-join]")).to_have_count(0)
    expect(row.get_by_role("button", name="Delete")).to_have_count(0)
    row.get_by_role("button", name="Labels").click()
    dialog = page.locator("dialog")
    dialog.get_by_role("textbox").fill("zone=east")
    dialog.get_by_role("button", name="Save labels").click()
    expect(dialog).to_have_count(0)
    expect(row.locator(".chip", has_text="zone=east")).to_be_visible()
    quiet(page)
    screenshot(page, shots["workers"])
    page.set_viewport_size(PHONE)
    for key in (row.get_by_role("link", name="east-1"), row.get_by_role("button", name="Labels")):
        expect(key).to_be_in_viewport()
    screenshot(page, shots["workers_phone"])
    page.set_viewport_size(DESKTOP)


def deploy(page, expected, cluster_id, shots):
    """Dana's New model: the cluster select holds east only, chosen; the model runs on
    east-1, and she may edit and delete it and restart its instance."""
    page.locator("nav a[data-screen=models]").click()
    page.get_by_role("button", name="New model").click()
    chooser = page.locator("select[data-cluster-select]")
    expect(chooser).to_be_visible()
    expect(chooser.locator("option")).to_have_text(["east"])
    expect(chooser).to_have_value(str(cluster_id))
    form = page.locator("form", has=chooser)
    form.get_by_role("textbox", name="Name").fill("tiny-east")
    form.get_by_role("textbox", name="Path").fill(expected["model_path"])
    form.get_by_role("textbox", name="Backend arguments").fill("-c 256 -t 1 -tb 1 -np 1")
    form.get_by_role("button", name="Check fit").click()
    estimate = form.locator("[data-estimate]")
    expect(estimate.locator("[data-estimate-worker]")).to_have_count(1)
    expect(estimate.locator("[data-estimate-worker=east-1]")).to_be_visible()
    screenshot(page, shots["model_form"])
    form.get_by_role("button", name="Create model").click()
    row = page.locator("tr", has=page.get_by_text("tiny-east", exact=True))
    expect(row.locator(".badge")).to_have_text("1 / 1", timeout=RUNNING_TIMEOUT_MS)
    for name in ("Edit", "Delete"):
        expect(row.get_by_role("button", name=name)).to_be_visible()
    status, models = api(page, expected, "GET", "/api/v1/models?name=tiny-east")
    assert status == 200 and models["items"][0]["cluster_id"] == cluster_id, models
    status, instances = api(page, expected, "GET", f"/api/v1/model-instances?cluster_id={cluster_id}")
    assert status == 200 and [i["worker_name"] for i in instances["items"]] == ["east-1"], instances
    quiet(page)
    screenshot(page, shots["models"])
    screenshot(page, shots["models_phone"], PHONE)
    page.locator("nav a[data-screen=instances]").click()
    instance = page.locator("tr[data-instance]", has_text="tiny-east-0")
    expect(instance.get_by_role("button", name="Restart")).to_be_enabled()


def refused(page, expected, admin_page, worker_id, shots):
    """The admin gives dana the default cluster instead of east while her labels dialog is
    open: saving is refused (403), and the dialog shows the server's sentence."""
    page.locator("nav a[data-screen=workers]").click()
    row = page.locator("tr[data-worker=east-1]")
    row.get_by_role("button", name="Labels").click()
    dialog = page.locator("dialog")
    status, users = api(admin_page, expected, "GET", "/api/v1/users")
    assert status == 200, users
    dana = next(u for u in users["items"] if u["username"] == DANA[0])
    status, changed = api(admin_page, expected, "PATCH", f"/api/v1/users/{dana['id']}", {"cluster_admin_of": [1]})
    assert status == 200, changed
    eventually("dana's right to east-1 to end",
               lambda: api(page, expected, "GET", f"/api/v1/workers/{worker_id}")[0] == 403)
    dialog.get_by_role("textbox").fill("zone=west")
    dialog.get_by_role("button", name="Save labels").click()
    expect(dialog.get_by_role("alert")).to_have_text(
        "This action needs the admin role or the administration of the cluster it concerns; "
        "an admin can grant it (cluster_admin_of on your user).")
    screenshot(page, shots["refused"])
    dialog.get_by_role("button", name="Cancel").click()
    expect(dialog).to_have_count(0)


def plain_user(page, shots):
    """Paul administers no cluster: no Clusters or Workers entries, no New model, and the
    workers' address shows the overview."""
    operate = page.locator("nav.nav .nav-group").nth(1)
    expect(operate.locator("a")).to_have_text(["Instances"])
    expect(page.locator("nav a[data-screen=clusters]")).to_have_count(0)
    expect(page.locator("nav a[data-screen=workers]")).to_have_count(0)
    page.locator("nav a[data-screen=models]").click()
    expect(page.locator("h1")).to_have_text("Models")
    expect(page.locator("tr", has=page.get_by_text("tiny-east", exact=True))).to_be_visible()
    expect(page.get_by_role("button", name="New model")).to_have_count(0)
    expect(page.get_by_role("button", name="Edit")).to_have_count(0)
    screenshot(page, shots["plain_user"])
    screenshot(page, shots["plain_user_phone"], PHONE)
    go(page, "workers")
    expect(page.locator("h1")).to_have_text("Overview")
    go(page, "clusters")
    expect(page.locator("h1")).to_have_text("Overview")


def main():
    expected = json.loads(sys.argv[1])
    shots = expected["screenshots"]
    worker = None
    stopped = None

    def steps(page):
        nonlocal worker
        first_login(page, expected)
        cluster_id, worker_id, worker = set_up(page, expected)
        log_in_as(page, expected, DANA)
        # The admin's own session, apart from the page's, for the change made while dana
        # is logged in (after the page's logout, which ends all of the admin's sessions).
        admin_page = page.context.browser.new_context().new_page()
        status, body = api(admin_page, expected, "POST", "/auth/login",
                           {"username": "admin", "password": expected["new_password"]})
        assert status == 200, body
        clusters(page, cluster_id, shots)
        workers(page, shots)
        deploy(page, expected, cluster_id, shots)
        refused(page, expected, admin_page, worker_id, shots)
        log_in_as(page, expected, PAUL)
        plain_user(page, shots)

    # The labels saved after the admin took east from dana are refused on purpose, and so
    # is her test's own check that they were.
    on_purpose = re.compile(r"status of 403 .*/api/v1/workers/\d+(/labels)?( |$)")
    try:
        run_session(expected, steps, on_purpose=lambda p: bool(on_purpose.search(p)))
    finally:
        if worker is not None:
            worker.send_signal(signal.SIGTERM)
            try:
                stopped = worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                worker.kill()
                raise
    assert stopped == 0, f"the joined worker exited with {stopped}"
    print("console cluster administrators checks passed")


if __name__ == "__main__":
    main()
