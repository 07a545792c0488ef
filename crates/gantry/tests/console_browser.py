"""A newcomer's first session in the web console, in a real browser (Debian's chromium
through Playwright's Python package, `executable_path`: no browser download), against a
real `gantry start` with a real llama-server.

Run by `tests/console_e2e.rs`, which passes one JSON argument:

    {"base": "http://127.0.0.1:PORT", "chromium": "/usr/bin/chromium",
     "initial_password": "...", "new_password": "...", "model_path": "/.../tiny.gguf",
     "model": "tiny-chat", "screenshots": {"NAME": PNG, ...}}

Log in with the generated password and change it, create a model from the form, see it
reach running, chat with it in the playground (a streamed answer with its time to first
token and speed; the request as curl and Python; two panes side by side), create an API key
with a rate limit and copy it, see the usage of those chats, add a provider (this gantry's
own gateway, called with that key) and discover its models, route a name to the model with
the provider as fallback, change a weight, chat through the route and see which target
answered and each target's share of the traffic, delete the route and the provider, delete
the model. It fails (exit status 1) on the first thing that is not as expected and on any
console error or uncaught page error, except the refusals it provokes on purpose.
"""

import json
import os
import re
import sys
import time

from playwright.sync_api import expect

from console_session import RUNNING_TIMEOUT_MS, first_login, run_session, screenshot


def create_model(page, expected, shots):
    page.locator("nav a[data-screen=models]").click()
    page.get_by_role("button", name="New model").click()
    form = page.locator("form", has=page.get_by_role("heading", name="New model"))
    form.get_by_role("textbox", name=re.compile(r"^Name")).fill(expected["model"])
    form.get_by_role("textbox", name=re.compile(r"^Path")).fill(expected["model_path"])
    form.get_by_role("textbox", name=re.compile(r"^Backend arguments")).fill("-c 256 -t 1 -tb 1 -np 1")
    screenshot(page, shots["model_form"])
    form.get_by_role("button", name="Create model").click()
    row = page.locator("tr", has=page.get_by_text(expected["model"], exact=True))
    expect(row.locator(".badge")).to_have_text("1 / 1", timeout=RUNNING_TIMEOUT_MS)
    screenshot(page, shots["models"])
    return row


def deploy_from_the_catalog(page, shots):
    """The catalog's entry fills the form and shows where it fits before it is created."""
    page.locator("nav a[data-screen=catalog]").click()
    card = page.locator("[data-catalog-entry=tiny-catalog]")
    expect(card).to_contain_text("Tiny test model")
    expect(card).to_contain_text("1M parameters")
    screenshot(page, shots["catalog"])
    card.get_by_role("button", name="Deploy").click()
    form = page.locator("form", has=page.get_by_role("heading", name="Deploy Tiny test model"))
    expect(form.get_by_role("textbox", name=re.compile(r"^Name"))).to_have_value("tiny-catalog")
    expect(form.locator("[data-estimate-fits]")).to_have_text("1 of 1 workers")
    expect(form.locator("[data-estimate-worker] .badge.ok")).to_have_text("yes")
    screenshot(page, shots["catalog_deploy"])
    form.get_by_role("button", name="Create model").click()
    expect(page.locator("h1")).to_have_text("Models")
    row = page.locator("tr", has=page.get_by_text("tiny-catalog", exact=True))
    expect(row.locator(".badge")).to_have_text("1 / 1", timeout=RUNNING_TIMEOUT_MS)
    row.get_by_role("button", name="Delete").click()
    page.locator("dialog").get_by_role("button", name="Delete model").click()
    expect(row).to_have_count(0)


def overview_and_worker(page, expected, shots):
    """The overview shows GPU memory claimed and in use; the worker's page its last hour."""
    page.locator("nav a[data-screen=overview]").click()
    claimed = page.locator("[data-gpu-memory=claimed] .num")
    expect(claimed).not_to_have_text("0 B")
    screenshot(page, shots["overview"])
    page.locator("nav a[data-screen=workers]").click()
    page.locator("table a[href^='#/workers/']").first.click()
    expect(page.locator("h1")).to_contain_text("Worker ")
    # The first sample comes with a heartbeat; the page reads the history every 10 s.
    for title in ("CPU busy", "GPU memory used", "GPU utilisation"):
        expect(page.locator(f"[data-history-chart='{title}']")).to_be_visible(timeout=40_000)
    expect(page.locator("[data-history-chart^='RAM used of']")).to_be_visible()
    expect(page.locator("[data-history-chart^='RAM used of'] polyline")).to_have_count(1)
    expect(page.get_by_text("Installed backends")).to_be_visible()
    screenshot(page, shots["worker"])
    page.locator("nav a[data-screen=models]").click()


def chat(page, expected, shots, row):
    row.get_by_role("link", name="Chat", exact=True).click()
    expect(page.locator("h1")).to_have_text("Playground")
    expect(page.locator("[data-pane-model='0']")).to_have_value(expected["model"])
    page.get_by_label("System prompt").fill("Answer in a few words.")
    page.get_by_label("Max tokens").fill("24")
    page.get_by_label("Message").fill("Say hello to the cluster.")
    with page.expect_response("**/v1/chat/completions") as answered:
        page.get_by_role("button", name="Send").click()
    response = answered.value
    assert response.status == 200, f"the gateway answered {response.status}"
    kind = response.headers.get("content-type", "")
    assert "text/event-stream" in kind, f"not streamed: {kind}"
    answer = page.locator("[data-pane='0'] [data-answer]").first
    stats = page.locator("[data-pane='0'] [data-stats]").first
    expect(stats).to_contain_text("first token")
    expect(stats).to_contain_text(re.compile(r"\d+ tokens"))
    assert answer.inner_text().strip(), "the answer is empty"
    outcome = page.locator("[data-pane='0'] .message.assistant").first.get_attribute("data-outcome")
    assert outcome == "done", f"the answer ended {outcome}"
    print("playground answer:", repr(answer.inner_text()), "|", stats.inner_text())
    screenshot(page, shots["playground"])

    # The same request as code, to copy.
    page.get_by_label("Message").fill("And now as code.")
    page.get_by_role("button", name="View as code").click()
    code = page.locator("dialog [data-code]")
    expect(code).to_contain_text("curl -N " + expected["base"] + "/v1/chat/completions")
    expect(code).to_contain_text('"model": "' + expected["model"] + '"')
    expect(code).to_contain_text("Answer in a few words.")
    page.locator("dialog").get_by_role("button", name="Python").click()
    expect(code).to_contain_text("from openai import OpenAI")
    expect(code).to_contain_text('base_url="' + expected["base"] + '/v1"')
    expect(code).to_contain_text("max_tokens=24")
    screenshot(page, shots["playground_code"])
    page.locator("dialog").get_by_role("button", name="Close").click()
    expect(page.locator("dialog")).to_have_count(0)

    # Two panes, one prompt: each answers on its own.
    page.get_by_label("Compare two models").check()
    expect(page.locator("[data-pane]")).to_have_count(2)
    page.get_by_label("Message").fill("Compare this.")
    page.get_by_role("button", name="Send").click()
    for pane in ("0", "1"):
        expect(page.locator(f"[data-pane='{pane}'] [data-stats]").last).to_contain_text("first token")
    # The first pane kept its conversation; the second began with this prompt.
    expect(page.locator("[data-pane='0'] .message.assistant")).to_have_count(2)
    expect(page.locator("[data-pane='1'] .message.assistant")).to_have_count(1)
    screenshot(page, shots["playground_compare"])


def usage(page, expected, shots):
    """The usage page counts the playground's requests, and moves when another arrives."""
    page.locator("nav a[data-screen=usage]").click()
    requests = page.locator("[data-total=requests]")
    # The playground sent 3 chats (one, then two side by side).
    expect(requests).to_have_text(re.compile(r"^[3-9]$|^\d\d+$"))
    before = int(requests.inner_text().replace(",", ""))
    expect(page.locator("[data-chart] rect").first).to_be_visible()
    expect(page.locator("[data-usage-table] tbody tr")).to_have_count(1)
    expect(page.locator("[data-usage-table] tbody tr td").first).to_have_text(expected["model"])
    screenshot(page, shots["usage"])
    # One more request, sent by the page with its session, shows up on the open page.
    status = page.evaluate(
        """async (model) => (await fetch('/v1/chat/completions', {method: 'POST',
            headers: {'content-type': 'application/json'},
            body: JSON.stringify({model, max_tokens: 4, messages: [{role: 'user', content: 'count me'}]})})).status""",
        expected["model"],
    )
    assert status == 200, f"the extra chat answered {status}"
    expect(requests).to_have_text(str(before + 1), timeout=30_000)
    # By API key: the console's own requests carry no key.
    page.get_by_role("button", name="API key", exact=True).click()
    expect(page.locator("[data-usage-table] tbody tr td").first).to_contain_text("console session")
    page.get_by_role("button", name="Requests", exact=True).click()
    expect(page.locator("[data-chart]")).to_have_attribute("aria-label", "requests over time")
    screenshot(page, shots["usage_by_key"])


def stop(page, expected, shots):
    """Stop cancels a streaming answer, and the cancel reaches the backend: a slow
    backend double (`slow_openai.py`, run as a custom backend) notes when its client left."""
    base = expected["base"]
    slow = expected["slow"]
    command = f"{slow['python']} {slow['script']} --host {{host}} --port {{port}} --cancelled {slow['cancelled']}"
    created = page.request.post(
        base + "/api/v1/models",
        data=json.dumps({
            "name": "slow", "backend": "custom", "replicas": 1, "custom_command": command,
            "source": {"type": "local_path", "path": expected["model_path"]},
        }),
        headers={"content-type": "application/json"},
    )
    assert created.status == 201, created.text()
    model_id = created.json()["id"]
    deadline = time.time() + RUNNING_TIMEOUT_MS / 1000
    while "slow" not in [m["id"] for m in page.request.get(base + "/v1/models").json()["data"]]:
        assert time.time() < deadline, "the slow model never ran"
        time.sleep(0.2)
    page.goto(base + "/#/playground?model=slow")
    expect(page.locator("[data-pane-model='0']")).to_have_value("slow")
    page.get_by_label("Message").fill("Count slowly.")
    page.get_by_role("button", name="Send").click()
    answer = page.locator("[data-pane='0'] [data-answer]").last
    expect(answer).to_contain_text("tick 3")
    page.get_by_role("button", name="Stop").click()
    message = page.locator("[data-pane='0'] .message.assistant").last
    expect(message).to_have_attribute("data-outcome", "stopped")
    expect(page.locator("[data-pane='0'] [data-stats]").last).to_contain_text("stopped")
    expect(page.get_by_role("button", name="Send")).to_be_enabled()
    text = answer.inner_text()
    assert "tick 60" not in text, f"it went on after Stop: {text}"
    deadline = time.time() + 10
    while not os.path.exists(slow["cancelled"]):
        assert time.time() < deadline, "the backend never saw its client go"
        time.sleep(0.1)
    screenshot(page, shots["playground_stop"])
    deleted = page.request.delete(f"{base}/api/v1/models/{model_id}")
    assert deleted.status == 204, deleted.text()


def api_key(page, shots):
    """A key with a rate limit, copied once; answers the key."""
    page.locator("nav a[data-screen=api-keys]").click()
    page.get_by_placeholder("laptop").fill("browser-key")
    page.get_by_role("spinbutton", name=re.compile(r"^Requests per minute")).fill("600")
    page.get_by_role("button", name="Create key").click()
    key = page.get_by_label("The new API key")
    expect(key).to_have_value(re.compile(r"^gantry_"))
    page.get_by_role("button", name="Copy", exact=True).click()
    expect(page.get_by_role("button", name="Copied")).to_be_visible()
    copied = page.evaluate("navigator.clipboard.readText()")
    assert copied == key.input_value(), "the clipboard does not hold the key"
    row = page.locator("[data-api-keys] tr", has_text="browser-key")
    expect(row.locator("[data-part=limits]")).to_have_text("600 req/min")
    # Limits change in place (PATCH); empty fields stay unlimited.
    row.get_by_role("button", name="Edit").click()
    page.locator("dialog").get_by_role("spinbutton", name=re.compile(r"^Tokens per minute")).fill("100000")
    page.locator("dialog").get_by_role("button", name="Save").click()
    expect(row.locator("[data-part=limits] .chip")).to_have_text(["600 req/min", "100,000 tokens/min"])
    screenshot(page, shots["api_key"])
    return copied


def providers_and_routes(page, expected, shots, key):
    """A provider that is this gantry's own gateway (reached with the key just made), a
    route to the deployed model with the provider as its fallback, a weight changed, a chat
    through the route, the traffic each target got; then the provider refused while the
    route uses it, and both deleted."""
    base = expected["base"]
    model = expected["model"]
    page.locator("nav a[data-screen=providers]").click()
    expect(page.get_by_text("No providers yet", exact=False)).to_be_visible()
    page.get_by_role("button", name="New provider").click()
    form = page.locator("form[data-provider-form='']")
    form.get_by_role("textbox", name=re.compile(r"^Name")).fill("loopback")
    form.get_by_role("textbox", name=re.compile(r"^Base URL")).fill(base + "/v1")
    form.get_by_label("API key", exact=True).fill(key)
    form.get_by_role("button", name="Create provider").click()
    provider = page.locator("[data-provider=loopback]")
    expect(provider.locator("[data-part=key]")).to_have_text("set")
    expect(provider.locator("[data-part=models]")).to_have_text("any")
    # The provider's GET /models is this gateway's: it lists the deployed model.
    provider.get_by_role("button", name="Edit").click()
    form = page.locator("form[data-provider-form=loopback]")
    form.get_by_role("button", name="Discover models").click()
    found = form.locator("[data-discovered] label", has_text=model)
    found.locator("input").check()
    form.get_by_role("button", name="Use the ticked ones").click()
    expect(form.get_by_label("Models", exact=True)).to_have_value(model)
    form.get_by_role("button", name="Save").click()
    expect(provider.locator("[data-part=models]")).to_have_text(model)
    screenshot(page, shots["providers"])

    page.locator("nav a[data-screen=routes]").click()
    expect(page.get_by_text("No routes yet", exact=False)).to_be_visible()
    page.get_by_role("button", name="New route").click()
    form = page.locator("form[data-route-form='']")
    form.get_by_role("textbox", name=re.compile(r"^Name")).fill("chat")
    form.locator("[data-target-row='0']").get_by_label("Deployed model").select_option(model)
    form.get_by_role("button", name="Add target").click()
    fallback = form.locator("[data-target-row='1']")
    fallback.get_by_label("Kind").select_option("provider")
    fallback.get_by_label("Provider model").fill(model)
    fallback.get_by_label("Priority").fill("1")
    expect(form.locator("[data-plan]")).to_contain_text(f"(priority 1): loopback/{model} 100 %")
    screenshot(page, shots["route_form"])
    form.get_by_role("button", name="Create route").click()
    route = page.locator("[data-route=chat]")
    expect(route.locator("[data-target]")).to_have_count(2)
    local = route.locator(f"[data-target='{model}']")
    expect(local.locator("[data-part=weight]")).to_have_text(re.compile(r"^1 "))
    expect(route.locator(f"[data-target='loopback/{model}'] [data-part=priority]")).to_contain_text("fallback")
    route.get_by_role("button", name="Edit").click()
    form = page.locator("form[data-route-form=chat]")
    form.locator("[data-target-row='0']").get_by_label("Weight").fill("3")
    form.get_by_role("button", name="Save").click()
    expect(local.locator("[data-part=weight]")).to_have_text(re.compile(r"^3 "))

    # The playground lists the route (GET /v1/models) and says which target answered.
    route.get_by_role("link", name="Chat").click()
    expect(page.locator("[data-pane-model='0']")).to_have_value("chat")
    page.get_by_label("Max tokens").fill("8")
    page.get_by_label("Message").fill("Through the route.")
    page.get_by_role("button", name="Send").click()
    expect(page.locator("[data-pane='0'] [data-stats]").last).to_contain_text("via " + model)
    screenshot(page, shots["playground_route"])
    page.locator("nav a[data-screen=routes]").click()
    # Usage reaches the report within a second or so; the screen re-reads it every 10 s.
    expect(local.locator("[data-part=traffic]")).to_contain_text("100 %", timeout=30_000)
    expect(route.locator("[data-part=requests]")).to_have_text("1")
    screenshot(page, shots["routes"])

    page.locator("nav a[data-screen=providers]").click()
    provider.get_by_role("button", name="Delete").click()
    dialog = page.locator("dialog")
    dialog.get_by_role("button", name="Delete provider").click()
    # 409: the message names the route that uses the provider, and the dialog stays open.
    expect(dialog.get_by_role("alert")).to_contain_text("chat")
    screenshot(page, shots["provider_in_use"])
    dialog.get_by_role("button", name="Cancel").click()
    page.locator("nav a[data-screen=routes]").click()
    route.get_by_role("button", name="Delete").click()
    page.locator("dialog").get_by_role("button", name="Delete route").click()
    expect(page.get_by_text("No routes yet", exact=False)).to_be_visible()
    page.locator("nav a[data-screen=providers]").click()
    provider.get_by_role("button", name="Delete").click()
    page.locator("dialog").get_by_role("button", name="Delete provider").click()
    expect(page.get_by_text("No providers yet", exact=False)).to_be_visible()


def delete_model(page, expected, shots):
    page.locator("nav a[data-screen=models]").click()
    row = page.locator("tr", has=page.get_by_text(expected["model"], exact=True))
    row.get_by_role("button", name="Delete").click()
    page.locator("dialog").get_by_role("button", name="Delete model").click()
    expect(page.get_by_text("No models yet.", exact=False)).to_be_visible()
    screenshot(page, shots["models_empty"])


def main():
    expected = json.loads(sys.argv[1])
    shots = expected["screenshots"]

    def steps(page):
        first_login(page, expected, shots["password"])
        row = create_model(page, expected, shots)
        deploy_from_the_catalog(page, shots)
        overview_and_worker(page, expected, shots)
        chat(page, expected, shots, row)
        usage(page, expected, shots)
        stop(page, expected, shots)
        key = api_key(page, shots)
        providers_and_routes(page, expected, shots, key)
        delete_model(page, expected, shots)

    # The provider's delete is refused on purpose while a route uses it (409).
    run_session(
        expected,
        steps,
        on_purpose=lambda p: "status of 409" in p and p.endswith("/api/v1/model-providers/loopback"),
        viewport={"width": 1360, "height": 760},
        clipboard=True,
    )
    print("console checks passed")


if __name__ == "__main__":
    main()
