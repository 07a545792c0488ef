"""Drives the web console in a real browser: Debian's chromium, through Playwright's
Python package (`executable_path`, so Playwright downloads no browser of its own).

Run by `tests/ui.rs`, which starts the server and passes what the page must show as one
JSON argument; its "checks" says which screens to check.

`the_console_shows_the_servers_and_their_leader_in_a_real_browser`:

    {"checks": "servers", "base": "http://127.0.0.1:PORT", "chromium": "/usr/bin/chromium",
     "screenshot": "/path/servers.png", "screenshot_dark": "/path/servers-dark.png",
     "admin": {"username": ..., "password": ...}, "user": {"username": ..., "password": ...},
     "leader": "test-server", "fencing_token": 1, "scheduling_mode": "local",
     "server_url": "http://..."}

`the_console_shows_download_progress_and_model_files_in_a_real_browser`, where the script
itself reports the instance's download as its worker does (with the worker's credential)
while it watches the page:

    {"checks": "downloads", "base": ..., "chromium": ..., "admin": {...},
     "screenshots": {"instances": PNG, "instances_dark": PNG, "overview": PNG,
                     "models": PNG, "model_files": PNG, "model_files_dark": PNG},
     "worker_credential": "gantryw_...", "instance": {"id": 1, "name": "llama-3-8b-0"},
     "model": "llama-3-8b", "worker": "gpu-1",
     "unreachable_worker": {"id": 2, "name": "gpu-2"},
     "files": {"ready": "1/sha256-...", "downloading": ..., "partial": ..., "error": ...}}

`the_console_uploads_a_model_file_and_deploys_it_in_a_real_browser`, where the script
makes the files it uploads (deterministic bytes of the sizes given) and sends the start
of one through the API itself, to resume it in the page:

    {"checks": "uploads", "base": ..., "chromium": ..., "admin": {...},
     "screenshots": {"progress": PNG, "refused": PNG, "uploads": PNG,
                     "uploads_dark": PNG, "model_source": PNG},
     "chunk_size": 8388608, "model": "tiny-llama",
     "deployed": {"name": "tiny-llama.Q4_K_M.gguf", "size": 16900673},
     "resumed": {"name": "resume.gguf", "size": 8454144, "sent_first": 300000},
     "wrong_digest": {"name": "wrong.gguf", "size": 1000}}

It fails (an uncaught exception, exit status 1) on the first thing that is not as
expected, and on any console error or uncaught page error, which is how chromium reports
what the Content-Security-Policy blocked.
"""

import hashlib
import json
import random
import re
import sys

from playwright.sync_api import Error as PlaywrightError, expect, sync_playwright

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
    expect(nav.get_by_role("link", name="Model files")).to_have_count(0)
    # Asking for the screen by URL shows the overview instead.
    page.goto(base + "/#/servers")
    expect(page).to_have_title("Overview · gantry")
    expect(page.locator("[data-cluster]")).to_have_count(0)
    page.goto(base + "/#/model-files")
    expect(page).to_have_title("Overview · gantry")


# ------------------------------------------------------------------ downloads


def report(worker_api, instance_id, body):
    """Reports the instance's state as its worker does."""
    response = worker_api.post(f"/api/v1/worker/instances/{instance_id}/state", data=body)
    assert response.status == 200, f"{response.status} {response.text()}"


def downloading(done, total, speed, message):
    return {
        "state": "downloading",
        "state_message": message,
        "download": {"bytes_done": done, "bytes_total": total, "bytes_per_second": speed},
    }


def expect_progress(progress, percent, bytes_text, speed=None, eta=None):
    """The numbers under a progress bar, and the bar's own value and width."""
    expect(progress.locator("[data-part=percent]")).to_have_text(percent)
    expect(progress.locator("[data-part=bytes]")).to_have_text(bytes_text)
    if speed is not None:
        expect(progress.locator("[data-part=speed]")).to_have_text(speed)
    if eta is not None:
        expect(progress.locator("[data-part=eta]")).to_have_text(eta)
    bar = progress.get_by_role("progressbar")
    if percent == "—":
        expect(bar).to_have_class(re.compile(r"\bindeterminate\b"))
        expect(bar).not_to_have_attribute("aria-valuenow", re.compile(".*"))
        return
    expect(bar).to_have_attribute("aria-valuenow", percent.rstrip("%"))
    # The stylesheet draws the fill as wide as the percent says.
    share = bar.evaluate(
        "bar => bar.firstElementChild.getBoundingClientRect().width / bar.getBoundingClientRect().width"
    )
    wanted = int(percent.rstrip("%")) / 100
    assert abs(share - wanted) < 0.02, f"the bar is {share:.3f} full, not {wanted}"


def check_download_progress(page, base, expected, worker_api, screenshots):
    instance = expected["instance"]
    report(worker_api, instance["id"], downloading(
        1_288_490_188, 4_920_733_984, 23_068_672, "downloading 1.2 GiB of 4.6 GiB at 22.0 MiB/s"))

    page.goto(base + "/#/instances")
    expect(page).to_have_title("Instances · gantry")
    row = page.locator(f'tr[data-instance="{instance["id"]}"]')
    expect(row.locator(".badge")).to_have_text("downloading")
    progress = row.locator("[data-progress]")
    expect_progress(progress, "26%", "1.2 GiB / 4.6 GiB", "22.0 MiB/s", "2 min 37 s left")
    # The worker's words are kept on hover.
    expect(progress).to_have_attribute("title", "downloading 1.2 GiB of 4.6 GiB at 22.0 MiB/s")
    page.screenshot(path=screenshots["instances"], full_page=True, animations="disabled")
    page.emulate_media(color_scheme="dark")
    page.screenshot(path=screenshots["instances_dark"], full_page=True, animations="disabled")
    page.emulate_media(color_scheme="light")

    # The overview lists the downloads in progress; the models list sums its instances'.
    page.goto(base + "/#/overview")
    download = page.locator(f'[data-downloads] tr[data-instance="{instance["id"]}"]')
    expect(download).to_contain_text(instance["name"])
    expect(download).to_contain_text(expected["worker"])
    expect_progress(download.locator("[data-progress]"), "26%", "1.2 GiB / 4.6 GiB",
                    "22.0 MiB/s", "2 min 37 s left")
    page.screenshot(path=screenshots["overview"], full_page=True, animations="disabled")
    page.goto(base + "/#/models")
    model_download = page.locator(".model-download")
    expect(model_download).to_contain_text("1 downloading")
    expect_progress(model_download.locator("[data-progress]"), "26%", "1.2 GiB / 4.6 GiB")
    page.screenshot(path=screenshots["models"], full_page=True, animations="disabled")

    # Reports change the bar where it is: the watch stream brings them, nothing reloads.
    page.goto(base + "/#/instances")
    expect(progress.locator("[data-part=percent]")).to_have_text("26%")
    page.evaluate("window.sameDocument = true")
    report(worker_api, instance["id"], downloading(
        3_758_096_384, 4_920_733_984, 0, "downloading 3.5 GiB of 4.6 GiB"))
    expect_progress(progress, "76%", "3.5 GiB / 4.6 GiB", "0 B/s", "— left")
    report(worker_api, instance["id"], downloading(
        3_865_470_566, None, 10_485_760, "downloading 3.6 GiB at 10.0 MiB/s"))
    expect_progress(progress, "—", "3.6 GiB / ?", "10.0 MiB/s", "— left")
    report(worker_api, instance["id"], {"state": "starting", "state_message": "starting llama.cpp"})
    expect(row.locator(".badge")).to_have_text("starting")
    expect(row.locator("[data-progress]")).to_have_count(0)
    expect(row).to_contain_text("starting llama.cpp")
    assert page.evaluate("window.sameDocument === true"), "the page reloaded"


def check_model_files(page, base, expected, screenshots):
    nav = page.locator("nav.nav")
    links = nav.locator("a").all_inner_texts()
    # Operate: Workers, their Clusters, then the files on the workers.
    assert links.index("Clusters") == links.index("Workers") + 1, f"navigation: {links}"
    assert links.index("Model files") == links.index("Clusters") + 1, f"navigation: {links}"
    nav.get_by_role("link", name="Model files").click()
    expect(page).to_have_title("Model files · gantry")
    expect(nav.locator("a.active")).to_have_text("Model files")

    files = expected["files"]
    rows = page.locator("tbody tr[data-file]")
    expect(rows).to_have_count(4)

    def row(which):
        return page.locator(f'tr[data-file="{files[which]}"]')

    ready = row("ready")
    name = ready.locator("[data-part=name]")
    expect(name).to_have_text("qwen2.5-0.5b-instruct-q4_k_m.gguf")
    expect(name).to_have_attribute("title", re.compile(
        r"^hf/Qwen/Qwen2\.5-0\.5B-Instruct-GGUF/9217f5db\w+/qwen2\.5-0\.5b-instruct-q4_k_m\.gguf\n"))
    expect(ready).to_contain_text("hf/Qwen/Qwen2.5-0.5B-Instruct-GGUF/9217f5db")
    expect(ready.locator("td").nth(1)).to_have_text(expected["worker"])
    expect(ready.locator("td").nth(2)).to_have_text("469 MiB")
    expect(ready.locator(".badge")).to_have_text("ready")
    expect(ready.locator("[data-progress]")).to_have_count(0)
    expect(ready.locator("td").nth(4)).to_have_text("—")
    expect(ready.locator("td").nth(5)).to_have_text("2 h ago")

    downloading_row = row("downloading")
    expect(downloading_row.locator("[data-part=name]")).to_have_text("Meta-Llama-3-8B-Instruct-Q4_K_M.gguf")
    expect(downloading_row.locator(".badge")).to_have_text("downloading")
    expect(downloading_row.locator(".chip")).to_have_text(expected["model"])
    bar = downloading_row.get_by_role("progressbar")
    expect(bar).to_have_attribute("aria-valuenow", re.compile(r"^\d+$"))
    # The worker reports no speed for a cached file: none is made up.
    expect(downloading_row.locator("[data-part=speed]")).to_have_count(0)
    # The page re-reads the list on its own, and the stand-in's download grows each time.
    before = downloading_row.locator("[data-part=bytes]").inner_text()
    expect(downloading_row.locator("[data-part=bytes]")).not_to_have_text(before)

    partial = row("partial")
    expect(partial.locator(".badge")).to_have_text("partial")
    expect(partial.locator("[data-progress]")).to_have_class(re.compile(r"\bpaused\b"))
    expect_progress(partial.locator("[data-progress]"), "41%", "2.0 GiB / 4.8 GiB")

    failed = row("error")
    expect(failed.locator(".badge")).to_have_text("error")
    expect(failed).to_contain_text("HTTP 403 from the S3 store")
    expect(failed.locator("[data-progress]")).to_have_count(0)

    unreachable = page.locator("[data-unreachable]")
    gone = expected["unreachable_worker"]
    expect(unreachable.locator(f'li[data-worker="{gone["id"]}"]')).to_contain_text(
        f'{gone["name"]}: cannot reach worker {gone["name"]} at 127.0.0.1:1')

    page.screenshot(path=screenshots["model_files"], full_page=True, animations="disabled")
    page.emulate_media(color_scheme="dark")
    page.screenshot(path=screenshots["model_files_dark"], full_page=True, animations="disabled")
    page.emulate_media(color_scheme="light")

    # The worker refuses to delete a file in use: the dialog says why and stays open.
    downloading_row.get_by_role("button", name="Delete").click()
    dialog = page.locator("dialog")
    expect(dialog.get_by_role("heading")).to_have_text(
        f'Delete Meta-Llama-3-8B-Instruct-Q4_K_M.gguf from {expected["worker"]}?')
    dialog.get_by_role("button", name="Delete file").click()
    expect(dialog.get_by_role("alert")).to_contain_text(f'is used by {expected["model"]}')
    dialog.get_by_role("button", name="Cancel").click()
    expect(dialog).to_have_count(0)
    expect(rows).to_have_count(4)

    # A file nobody uses goes.
    partial.get_by_role("button", name="Delete").click()
    dialog.get_by_role("button", name="Delete file").click()
    expect(dialog).to_have_count(0)
    expect(page.locator("#toasts")).to_contain_text(
        f'mistral-7b-instruct-v0.3.Q5_K_M.gguf deleted from {expected["worker"]}.')
    expect(rows).to_have_count(3)
    expect(partial).to_have_count(0)

    # One worker's files: the filter asks the server for that worker only.
    page.locator("select[aria-label=Worker]").select_option(label=gone["name"])
    expect(page).to_have_url(re.compile(f'#/model-files\\?worker={gone["id"]}$'))
    expect(page.locator("[data-cache] .panel.empty")).to_have_text(
        "The worker did not answer: its files cannot be listed now.")
    expect(unreachable).to_contain_text(gone["name"])


# ------------------------------------------------------------------ uploads


def screenshot(page, path):
    """The whole page from its top (scrolled down to click a button, the sticky top bar
    would be drawn over the middle of it), without the toasts, which the checks read
    where they appear and which would hide the rows' buttons."""
    page.evaluate("window.scrollTo(0, 0); document.getElementById('toasts').replaceChildren()")
    page.screenshot(path=path, full_page=True, animations="disabled")


def file_bytes(spec):
    """The bytes of a file to upload: the same for the same name and size, every run."""
    return random.Random(spec["name"]).randbytes(spec["size"])


def payload(spec, data):
    return {"name": spec["name"], "mimeType": "application/octet-stream", "buffer": data}


def check_upload_with_a_failed_chunk(page, expected, section, patches):
    """Uploads a file of three chunks through the page's control. The second chunk is held
    until the live progress is checked, then fails; the page asks the server where to go
    on and sends it again."""
    chunk = expected["chunk_size"]
    spec = expected["deployed"]
    data = file_bytes(spec)
    digest = hashlib.sha256(data).hexdigest()
    held = []

    def hold_the_second_chunk(route):
        request = route.request
        if request.method == "PATCH" and request.headers.get("upload-offset") == str(chunk) and not held:
            held.append(route)  # answered below, once the progress has been looked at
            return
        route.continue_()

    page.route(re.compile(r"/api/v1/model-files/uploads/\d+$"), hold_the_second_chunk)
    form = section.locator("form")
    form.get_by_label("File to upload").set_input_files(payload(spec, data))
    form.get_by_label("SHA-256").fill(digest)
    form.get_by_role("button", name="Upload", exact=True).click()

    # One chunk arrived: the control and the list show it, live.
    transfer = section.locator("[data-transfer]")
    expect(transfer).to_contain_text(spec["name"])
    expect_progress(transfer.locator("[data-progress]"), "49%", "8.0 MiB / 16.1 MiB")
    expect(transfer.locator("[data-part=speed]")).to_have_text(re.compile(r"/s$"))
    expect(transfer.locator("[data-part=eta]")).to_have_text(re.compile(r" left$"))
    row = section.locator("tbody tr[data-upload]").filter(has_text=spec["name"])
    expect(row.locator(".badge")).to_have_text("uploading")
    expect_progress(row.locator("[data-progress]"), "49%", "8.0 MiB / 16.1 MiB")
    # Being sent from this page: nothing to resume.
    expect(row.get_by_role("button", name="Resume")).to_have_count(0)
    assert len(held) == 1, f"held {len(held)} chunks"
    screenshot(page, expected["screenshots"]["progress"])

    held[0].abort()
    expect(row.locator(".badge")).to_have_text("ready")
    expect(transfer).to_have_count(0)
    expect(page.locator("#toasts")).to_contain_text(f'{spec["name"]} is uploaded (16.1 MiB)')
    expect(form.locator(".alert")).to_be_empty()
    expect(row.locator("[data-part=size]")).to_have_text("16.1 MiB")
    sha = row.locator("[data-part=sha256] code")
    expect(sha).to_have_text(digest[:12] + "…")
    expect(sha).to_have_attribute("title", digest)
    expect(row.locator("[data-progress]")).to_have_count(0)
    expect(row.get_by_role("button", name="Resume")).to_have_count(0)
    page.unroute(re.compile(r"/api/v1/model-files/uploads/\d+$"))

    upload_id = int(row.get_attribute("data-upload"))
    sent = [offset for (upload, offset) in patches if upload == upload_id]
    assert sent == [0, chunk, chunk, 2 * chunk], f"the page sent the chunks at {sent}"
    return upload_id


def check_a_wrong_digest(page, expected, section):
    """The server refuses bytes that are not what was declared: the control says why, and
    the upload waits, empty, to be resumed or deleted."""
    spec = expected["wrong_digest"]
    form = section.locator("form")
    form.get_by_label("File to upload").set_input_files(payload(spec, file_bytes(spec)))
    form.get_by_label("SHA-256").fill("0" * 64)
    form.get_by_role("button", name="Upload", exact=True).click()
    expect(form.get_by_role("alert")).to_contain_text(
        f'The upload of {spec["name"]} stopped: upload ')
    expect(form.get_by_role("alert")).to_contain_text(f'but {"0" * 64} was declared')
    row = section.locator("tbody tr[data-upload]").filter(has_text=spec["name"])
    expect(row.locator(".badge")).to_have_text("uploading")
    expect_progress(row.locator("[data-progress]"), "0%", "0 B / 1000 B")
    expect(row.locator("[data-progress]")).to_have_class(re.compile(r"\bpaused\b"))
    expect(row.get_by_role("button", name="Resume")).to_be_visible()
    screenshot(page, expected["screenshots"]["refused"])

    # Nothing uses it, so it goes.
    row.get_by_role("button", name="Delete").click()
    dialog = page.locator("dialog")
    expect(dialog.get_by_role("heading")).to_have_text(f'Delete {spec["name"]}?')
    dialog.get_by_role("button", name="Delete upload").click()
    expect(dialog).to_have_count(0)
    expect(page.locator("#toasts")).to_contain_text(f'{spec["name"]} deleted.')
    expect(row).to_have_count(0)


def check_resume(page, base, expected, section, patches):
    """An upload interrupted elsewhere (its start sent through the API) continues in the
    page from where the server says it stopped, once its file is picked again; another
    file is refused, and a transfer stopped from the page can be resumed again."""
    spec = expected["resumed"]
    data = file_bytes(spec)
    first = spec["sent_first"]
    created = page.request.post(base + "/api/v1/model-files/uploads",
                                data={"name": spec["name"], "size": spec["size"]})
    assert created.status == 201, f"{created.status} {created.text()}"
    upload_id = created.json()["id"]
    started = page.request.patch(
        f"{base}/api/v1/model-files/uploads/{upload_id}",
        headers={"upload-offset": "0", "content-type": "application/offset+octet-stream"},
        data=data[:first])
    assert started.status == 200, f"{started.status} {started.text()}"

    # The list is re-read on its own.
    row = section.locator(f'tbody tr[data-upload="{upload_id}"]')
    expect(row.locator(".badge")).to_have_text("uploading")
    expect_progress(row.locator("[data-progress]"), "3%", "293 KiB / 8.1 MiB")
    expect(row).to_contain_text("Not being sent from this page")
    expect(row.locator("[data-part=sha256]")).to_have_text("—")

    row.get_by_role("button", name="Resume").click()
    dialog = page.locator("dialog")
    expect(dialog.get_by_role("heading")).to_have_text(f'Resume {spec["name"]}')
    expect(dialog).to_contain_text("continues from 293 KiB of 8.1 MiB")
    other = expected["wrong_digest"]
    dialog.get_by_label("File to upload").set_input_files(payload(other, file_bytes(other)))
    dialog.get_by_role("button", name="Resume").click()
    expect(dialog.get_by_role("alert")).to_have_text(
        f'{other["name"]} has {other["size"]} bytes, but {spec["name"]} has {spec["size"]}: '
        "pick the same file.")

    # The first try is stopped from the page while its chunk is on the way (held here):
    # the upload waits again where it was.
    held = []
    chunks = re.compile(r"/api/v1/model-files/uploads/\d+$")
    page.route(chunks, lambda route: held.append(route) if route.request.method == "PATCH" else route.continue_())
    dialog.get_by_label("File to upload").set_input_files(payload(spec, data))
    dialog.get_by_role("button", name="Resume").click()
    expect(dialog).to_have_count(0)
    transfer = section.locator(f'[data-transfer="{upload_id}"]')
    expect_progress(transfer.locator("[data-progress]"), "3%", "293 KiB / 8.1 MiB")
    transfer.get_by_role("button", name="Stop").click()
    expect(page.locator("#toasts")).to_contain_text(f'The upload of {spec["name"]} stopped; “Resume” continues it.')
    expect(transfer).to_have_count(0)
    expect(row.get_by_role("button", name="Resume")).to_be_visible()
    assert len(held) == 1, f"held {len(held)} chunks"
    # The held chunk never reaches the server, as a request the page cancelled would not
    # (left pending, Playwright may let it through when the route is removed, and the
    # next try then rightly continues after it).
    try:
        held[0].abort()
    except PlaywrightError:
        pass  # the cancelled request is gone already
    page.unroute(chunks)

    # The second goes through.
    row.get_by_role("button", name="Resume").click()
    dialog.get_by_label("File to upload").set_input_files(payload(spec, data))
    dialog.get_by_role("button", name="Resume").click()
    expect(dialog).to_have_count(0)
    expect(row.locator(".badge")).to_have_text("ready")
    expect(row.locator("[data-part=sha256] code")).to_have_text(hashlib.sha256(data).hexdigest()[:12] + "…")
    sent = [offset for (upload, offset) in patches if upload == upload_id]
    assert sent == [first, first], f"the page sent the rest at {sent}"


def check_upload_as_a_source(page, expected, upload_id):
    """The new-model form offers the complete uploads; the model created names the upload."""
    spec = expected["deployed"]
    page.locator("nav.nav").get_by_role("link", name="Models").click()
    expect(page).to_have_title("Models · gantry")
    page.get_by_role("button", name="New model").click()
    form = page.locator("form").filter(has=page.get_by_role("heading", name="New model"))
    form.get_by_placeholder("llama-3-8b", exact=True).fill(expected["model"])
    form.get_by_label(re.compile(r"^Source")).select_option(label="Uploaded file")
    choice = form.get_by_label("Uploaded file", exact=True)
    expect(choice.locator("option")).to_have_text([
        f'{expected["resumed"]["name"]} (8.1 MiB)', f'{spec["name"]} (16.1 MiB)'])
    choice.select_option(label=f'{spec["name"]} (16.1 MiB)')
    expect(choice).to_be_visible()
    screenshot(page, expected["screenshots"]["model_source"])
    form.get_by_role("button", name="Create model").click()
    expect(page.locator("#toasts")).to_contain_text(f'Model {expected["model"]} created with 1 replica.')
    expect(form).to_be_hidden()
    # The model's own row: the file uploaded is no model, so a row of why its instance
    # waits may follow it.
    row = page.locator("tbody tr:not(.detail)").filter(has_text=expected["model"])
    expect(row).to_contain_text(f"upload {upload_id}")


def check_uploads(page, base, expected):
    # Every PATCH the page sends, as (upload id, Upload-Offset).
    patches = []

    def note_patch(request):
        if request.method == "PATCH":
            patches.append((int(request.url.rsplit("/", 1)[1]), int(request.headers["upload-offset"])))

    page.on("request", note_patch)
    log_in(page, base, expected["admin"])
    nav = page.locator("nav.nav")
    nav.get_by_role("link", name="Model files").click()
    expect(page).to_have_title("Model files · gantry")
    section = page.locator("[data-uploads]")
    expect(section.get_by_role("heading", name="Uploads")).to_be_visible()
    expect(section.locator(".panel.empty")).to_have_text("No uploads yet.")

    deployed = check_upload_with_a_failed_chunk(page, expected, section, patches)
    check_a_wrong_digest(page, expected, section)
    check_resume(page, base, expected, section, patches)
    expect(section.locator("tbody tr[data-upload]")).to_have_count(2)
    screenshot(page, expected["screenshots"]["uploads"])
    page.emulate_media(color_scheme="dark")
    screenshot(page, expected["screenshots"]["uploads_dark"])
    page.emulate_media(color_scheme="light")

    check_upload_as_a_source(page, expected, deployed)

    # The server keeps an upload a model uses: the dialog says which model, and stays open.
    nav.get_by_role("link", name="Model files").click()
    row = section.locator(f'tbody tr[data-upload="{deployed}"]')
    row.get_by_role("button", name="Delete").click()
    dialog = page.locator("dialog")
    dialog.get_by_role("button", name="Delete upload").click()
    expect(dialog.get_by_role("alert")).to_have_text(
        f'upload {deployed} is the source of model(s) {expected["model"]}; delete or change them first')
    dialog.get_by_role("button", name="Cancel").click()
    expect(dialog).to_have_count(0)
    expect(row.locator(".badge")).to_have_text("ready")


def check_servers(page, base, expected):
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


def check_downloads(playwright, page, base, expected):
    # The worker's own calls: its credential, none of the page's cookies.
    worker_api = playwright.request.new_context(
        base_url=base,
        extra_http_headers={"authorization": "Bearer " + expected["worker_credential"]},
    )
    try:
        page.goto(base + "/#/instances")
        page.locator("input[name=username]").fill(expected["admin"]["username"])
        page.locator("input[name=password]").fill(expected["admin"]["password"])
        page.get_by_role("button", name="Log in").click()
        expect(page.locator("header.topbar")).to_be_visible()
        check_download_progress(page, base, expected, worker_api, expected["screenshots"])
        check_model_files(page, base, expected, expected["screenshots"])
    finally:
        worker_api.dispose()


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

            if expected["checks"] == "servers":
                check_servers(page, base, expected)
            elif expected["checks"] == "downloads":
                check_downloads(playwright, page, base, expected)
            elif expected["checks"] == "uploads":
                check_uploads(page, base, expected)
            else:
                raise ValueError(f"unknown checks {expected['checks']!r}")
        finally:
            browser.close()
    # A refused session is logged as a failed resource load (401), which is expected
    # before logging in; a worker's refusal to delete a file in use (409) is what the
    # downloads checks provoke; the uploads checks provoke a failed chunk, a wrong
    # digest (422) and a refusal to delete an upload in use (409). Anything else is a
    # fault of the page.
    expected_refusals = ["status of 401"]
    if expected["checks"] == "downloads":
        expected_refusals.append("status of 409")
    if expected["checks"] == "uploads":
        expected_refusals += ["net::ERR_FAILED", "status of 422", "status of 409"]
    problems = [p for p in problems if not any(r in p for r in expected_refusals)]
    assert not problems, "the page reported problems:\n" + "\n".join(problems)
    print("browser checks passed:", expected["checks"])


if __name__ == "__main__":
    main()
