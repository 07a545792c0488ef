"""A broken model looks broken and is fixed from the console, in a real browser (Debian's
chromium through Playwright's Python package, `executable_path`: no browser download),
against a real `gantry start` with two simulated GPUs and a real llama-server.

Run by `tests/e2e/console_failures.rs`, which passes one JSON argument:

    {"base": "http://127.0.0.1:PORT", "chromium": "/usr/bin/chromium",
     "initial_password": "...", "new_password": "...",
     "missing_path": "/.../models/missing.gguf", "outside_path": "/.../outside/tiny.gguf",
     "inside_path": "/.../models/tiny.gguf", "model_dirs": "/.../models",
     "screenshots": {"NAME": PNG, ...}}

Try a model whose file is missing ("Check fit", then "Create model": refused with a
sentence about the path); deploy a catalog entry from a hub the server cannot reach (said
so in words); create a model from a file the server reads but the worker refuses, and see
the worker's reason on the model's row and the model under "Needs attention"; fix its
source in the edit form (a missing one refused with a sentence first) and see it run;
restart its instance and see Restarts count 1; check where two replicas would go on two
simulated GPUs. Screenshots at 1440×900 and 390×844. It fails (exit status 1) on the first
thing that is not as expected and on any console error or uncaught page error, except the
refusals it provokes on purpose.
"""

import json
import re
import sys

from playwright.sync_api import expect

from console_session import DESKTOP, PHONE, RUNNING_TIMEOUT_MS, first_login, run_session, screenshot

# What a person should never read in the console: the API's field paths, the operating
# system's error numbers, a resolver's or socket's words, a retry of nothing.
BACKEND_TEXT = re.compile(
    r"source\.path|os error|dns error|error sending request|tcp connect|retried automatically"
)


def both_widths(page, desktop_path, phone_path):
    """A screenshot at 1440×900, then one at 390×844, once the toasts have gone (on a
    phone they cover the table); the page is left at 1440×900."""
    expect(page.locator(".toast")).to_have_count(0, timeout=10_000)
    screenshot(page, desktop_path)
    page.set_viewport_size(PHONE)
    screenshot(page, phone_path)
    page.set_viewport_size(DESKTOP)


def go(page, route):
    """Opens a screen by its address, as a bookmark would (the navigation's layout is
    another test's)."""
    page.evaluate("route => { location.hash = route; }", "#/" + route)


def assert_sentence(text):
    """A message for a person: no backend text, and it ends as a sentence does."""
    assert not BACKEND_TEXT.search(text), f"backend text shown to a person: {text!r}"
    assert text.strip().endswith("."), f"not a sentence: {text!r}"


def new_model_form(page):
    go(page, "models")
    expect(page.locator("h1")).to_have_text("Models")
    page.get_by_role("button", name="New model").click()
    return page.locator("form", has=page.get_by_role("heading", name="New model"))


def fill(form, name, path, replicas=1):
    form.get_by_role("textbox", name=re.compile(r"^Name")).fill(name)
    form.get_by_role("spinbutton", name=re.compile(r"^Replicas")).fill(str(replicas))
    form.get_by_role("textbox", name=re.compile(r"^Path")).fill(path)
    form.get_by_role("textbox", name=re.compile(r"^Backend arguments")).fill("-c 256 -t 1 -tb 1 -np 1")


def a_missing_file_is_refused_as_a_sentence(page, expected, shots):
    """The server cannot find the file: "Check fit" and "Create model" say so about the
    form's path, and nothing is created."""
    form = new_model_form(page)
    fill(form, "broken", expected["missing_path"])
    alert = form.get_by_role("alert")
    form.get_by_role("button", name="Check fit").click()
    expect(alert).to_contain_text(
        "The path " + expected["missing_path"] + " does not exist on the server."
    )
    expect(alert).to_contain_text("correct the path, or copy the file there")
    assert_sentence(alert.inner_text())
    screenshot(page, shots["missing_check_fit"])
    form.get_by_role("button", name="Create model").click()
    expect(alert).to_contain_text(
        "The path " + expected["missing_path"] + " does not exist on the server."
    )
    assert_sentence(alert.inner_text())
    print("refused:", alert.inner_text())
    both_widths(page, shots["missing_create"], shots["missing_create_phone"])
    form.get_by_role("button", name="Cancel").click()
    expect(page.get_by_text("No models yet.", exact=False)).to_be_visible()


def a_hub_the_server_cannot_reach_is_said_so(page, shots):
    go(page, "catalog")
    card = page.locator("[data-catalog-entry=hub-model]")
    card.get_by_role("button", name="Deploy").click()
    form = page.locator("form", has=page.get_by_role("heading", name="Deploy A model on the hub"))
    alert = form.get_by_role("alert")
    # The form checks the fit at once.
    expect(alert).to_contain_text("The server cannot reach 127.0.0.1 (it refuses connections)")
    expect(alert).to_contain_text("check the server's network and proxy settings")
    assert_sentence(alert.inner_text())
    print("hub:", alert.inner_text())
    both_widths(page, shots["hub_unreachable"], shots["hub_unreachable_phone"])
    form.get_by_role("button", name="Cancel").click()


def model_row(page, name):
    return page.locator("tr", has=page.get_by_text(name, exact=True))


def a_file_only_the_worker_refuses_shows_on_the_row_and_the_overview(page, expected, shots):
    """The server reads the file, so the model is created; the worker serves only its
    model directories, so its instance fails, and the console says why."""
    form = new_model_form(page)
    fill(form, "misplaced", expected["outside_path"])
    form.get_by_role("button", name="Create model").click()
    expect(page.locator("h1")).to_have_text("Models")
    row = model_row(page, "misplaced")
    reason = page.locator("[data-reason-of=misplaced] [data-model-reason]")
    expect(reason).to_contain_text("outside worker", timeout=RUNNING_TIMEOUT_MS)
    expect(reason).to_contain_text("restart the worker")
    expect(reason).to_contain_text(expected["model_dirs"])
    expect(row.locator(".badge").first).to_have_text("0 / 1")
    print("row:", reason.inner_text())
    both_widths(page, shots["model_reason"], shots["model_reason_phone"])

    go(page, "overview")
    attention = page.locator("[data-attention-model=misplaced]")
    expect(attention).to_contain_text("outside worker", timeout=RUNNING_TIMEOUT_MS)
    expect(attention).to_contain_text("1 of 1 instance")
    expect(page.get_by_text("Nothing: every instance", exact=False)).to_have_count(0)
    both_widths(page, shots["attention"], shots["attention_phone"])


def the_source_is_fixed_in_the_edit_form(page, expected, shots):
    go(page, "models")
    row = model_row(page, "misplaced")
    row.get_by_role("button", name="Edit").click()
    dialog = page.locator("dialog")
    expect(dialog.get_by_role("combobox", name="Source")).to_have_value("local_path")
    path = dialog.get_by_role("textbox", name=re.compile(r"^Path"))
    expect(path).to_have_value(expected["outside_path"])
    # A new source the server cannot find changes nothing, and says so about the path.
    path.fill(expected["missing_path"])
    dialog.get_by_role("button", name="Save").click()
    alert = dialog.get_by_role("alert")
    expect(alert).to_contain_text(
        "The path " + expected["missing_path"] + " does not exist on the server."
    )
    assert_sentence(alert.inner_text())
    screenshot(page, shots["edit_refused"])
    path.fill(expected["inside_path"])
    screenshot(page, shots["edit_source"])
    dialog.get_by_role("button", name="Save").click()
    expect(dialog).to_have_count(0)
    expect(row.locator(".badge").first).to_have_text("1 / 1", timeout=RUNNING_TIMEOUT_MS)
    expect(page.locator("[data-reason-of=misplaced]")).to_have_count(0)
    expect(row.locator(f'[title="{expected["inside_path"]}"]')).to_have_count(1)
    screenshot(page, shots["fixed"])
    go(page, "overview")
    expect(page.get_by_text("Nothing: every instance", exact=False)).to_be_visible(timeout=RUNNING_TIMEOUT_MS)


def a_restart_is_counted(page, shots):
    go(page, "instances")
    row = page.locator("tr[data-instance]", has=page.get_by_role("link", name="misplaced", exact=True))
    expect(row.locator(".badge").first).to_have_text("running")
    expect(row.locator("[data-restarts]")).to_have_text("0")
    row.get_by_role("button", name="Restart").click()
    dialog = page.locator("dialog")
    expect(dialog).to_contain_text("started again with the same GPUs and address")
    dialog.get_by_role("button", name="Restart").click()
    expect(dialog).to_have_count(0)
    expect(row.locator("[data-restarts]")).to_have_text("1", timeout=RUNNING_TIMEOUT_MS)
    expect(row.locator(".badge").first).to_have_text("running", timeout=RUNNING_TIMEOUT_MS)
    screenshot(page, shots["restarted"])


def two_replicas_go_to_two_gpus(page, expected, shots):
    """The estimate places the replicas together, as the scheduler would: one per GPU."""
    form = new_model_form(page)
    fill(form, "pair", expected["inside_path"], replicas=2)
    form.get_by_role("button", name="Check fit").click()
    replicas = form.locator("[data-estimate-replicas] [data-estimate-replica]")
    expect(replicas).to_have_count(2)
    gpus = sorted(re.search(r"GPU (\d+)", replicas.nth(n).inner_text()).group(1) for n in range(2))
    assert gpus == ["0", "1"], f"the replicas would go to GPUs {gpus}"
    worker = form.locator("[data-estimate-worker] td").first.inner_text()
    assert re.fullmatch(r"\S+\s+simulated", worker.strip(), re.IGNORECASE), (
        f"the worker's name and its badge run together: {worker!r}"
    )
    print("replicas:", [replicas.nth(n).inner_text() for n in range(2)], "| worker:", worker)
    both_widths(page, shots["estimate_pair"], shots["estimate_pair_phone"])
    form.get_by_role("button", name="Cancel").click()


def main():
    expected = json.loads(sys.argv[1])
    shots = expected["screenshots"]

    def steps(page):
        first_login(page, expected)
        a_missing_file_is_refused_as_a_sentence(page, expected, shots)
        a_hub_the_server_cannot_reach_is_said_so(page, shots)
        a_file_only_the_worker_refuses_shows_on_the_row_and_the_overview(page, expected, shots)
        the_source_is_fixed_in_the_edit_form(page, expected, shots)
        a_restart_is_counted(page, shots)
        two_replicas_go_to_two_gpus(page, expected, shots)

    # The refusals of a missing file and of an unreachable hub are provoked on purpose (422).
    refused_on_purpose = re.compile(r"status of 422 .* at .*/api/v1/models(/estimate|/\d+)?$")
    run_session(expected, steps, on_purpose=lambda p: bool(refused_on_purpose.search(p)))
    print("console failure checks passed")


if __name__ == "__main__":
    main()
