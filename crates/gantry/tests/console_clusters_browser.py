"""The console's clusters, in a real browser (Debian's chromium through Playwright's Python
package, `executable_path`: no browser download), against a real `gantry start` with a
simulated 24 GiB GPU and a real llama-server.

Run by `tests/e2e/console_clusters.rs`, which passes one JSON argument:

    {"base": "http://127.0.0.1:PORT", "chromium": "/usr/bin/chromium",
     "initial_password": "...", "new_password": "...", "model_path": "/.../tiny.gguf",
     "gantry": "/.../gantry", "joined_args": ["--data-dir", ...], "joined_log": "/...",
     "screenshots": {"NAME": PNG, ...}}

Make a cluster with "New cluster" and see its join command on its page; copy it and run it
to join a second worker to that cluster, and see the counts take it in; be refused a second
cluster of the same name, with a sentence; filter the workers, models, instances and the
overview by cluster; deploy a model into the cluster from the model form and see it run on
that cluster's worker; be refused the deletion of a cluster that holds a worker and a
model, with the sentence naming them; rotate the token after a confirmation that says
registered workers keep working; see a Kubernetes cluster's manifests with the image
chosen; make a user the administrator of a cluster. On a new cluster's page, be refused a
worker pool whose exec program is not in the server's pool_commands_dir, with a sentence;
make one whose program refuses every machine, as a cloud out of GPUs would, and see the
provider's words on its machine and in a failed event, "has credentials" and never the
credentials; change its bounds (a min above max refused with a sentence); delete it after
a confirmation that its machines go too. Screenshots at 1440×900 and 390×844.
It fails (exit status 1) on the first thing that is not as expected and on any console
error or uncaught page error, except the refusals it provokes on purpose.
"""

import json
import re
import shlex
import signal
import subprocess
import sys

from playwright.sync_api import expect

from console_session import DESKTOP, PHONE, RUNNING_TIMEOUT_MS, api_call, first_login, run_session, screenshot


def api(page, expected, method, path, body=None):
    """A call of the management API with the page's session; answers (status, JSON)."""
    return api_call(page, expected["base"], method, path, body)


def go(page, route):
    """Opens a screen by its address, as a bookmark or a link would."""
    page.evaluate("route => { location.hash = route; }", "#/" + route)


def quiet(page):
    """Waits for the toasts to go: on a phone they cover what a screenshot is of."""
    expect(page.locator(".toast")).to_have_count(0, timeout=10_000)


def navigation(page):
    """Clusters sits beside Workers, under Operate."""
    groups = page.locator("nav.nav .nav-group")
    expect(groups.nth(1).locator("a")).to_have_text(["Instances", "Workers", "Clusters", "Model files", "Servers"])


def new_cluster(page, expected, shots):
    """A cluster from the form opens on its page with the command that joins a machine to
    it, which the Copy button copies. Answers the command and the cluster's id."""
    page.locator("nav a[data-screen=clusters]").click()
    expect(page.locator("h1")).to_have_text("Clusters")
    default = page.locator("tr[data-cluster=default]")
    expect(default.locator("[data-part=workers]")).to_have_text("1 / 1")
    expect(default.locator("[data-part=state] .badge")).to_have_text("ready")
    expect(default.locator(".badge.idle")).to_have_text("default")
    # The default cluster cannot go: it has no Delete.
    expect(default.get_by_role("button", name="Delete")).to_have_count(0)
    expect(default.get_by_role("button", name="Edit")).to_be_visible()

    page.get_by_role("button", name="New cluster").click()
    form = page.locator("form[data-cluster-form]")
    form.get_by_label("Name").fill("east")
    form.get_by_label("Description").fill("The racks in the east room")
    expect(form.get_by_label("Provider")).to_have_value("custom")
    screenshot(page, shots["clusters_new"])
    form.get_by_role("button", name="Create cluster").click()

    expect(page.locator("h1")).to_have_text("Cluster east")
    cluster_id = int(re.search(r"#/clusters/(\d+)$", page.url).group(1))
    expect(page.locator(".page-head .badge").first).to_have_text("pending")
    expect(page.locator("[data-part=state-message]")).to_have_text(
        "No worker has joined yet: run the join command below on a GPU machine.")
    expect(page.locator("[data-fact=workers]")).to_contain_text("0 of 0")
    join = page.locator("[data-cluster-join]")
    command = join.locator("[data-join-command]")
    expect(command).to_have_text(re.compile(
        "^gantry worker --server-url " + re.escape(expected["base"]) + r" --token gantryreg_\S+$"))
    # A custom cluster has no manifests.
    expect(join.locator("[data-manifests]")).to_have_count(0)
    join.get_by_role("button", name="Copy").click()
    expect(join.get_by_role("button", name="Copied")).to_be_visible()
    copied = page.evaluate("navigator.clipboard.readText()")
    assert copied == command.inner_text(), f"the clipboard holds {copied!r}"
    # It is the cluster's own token, not the default cluster's.
    status, default_join = api(page, expected, "GET", "/api/v1/workers/join")
    assert status == 200, default_join
    assert default_join["token"] not in copied, "the new cluster's command holds the default cluster's token"
    quiet(page)
    screenshot(page, shots["cluster_join"])
    screenshot(page, shots["cluster_join_phone"], PHONE)
    return copied, cluster_id


def duplicate_name(page, shots):
    """A second cluster of a name taken is refused with a sentence; the form stays."""
    page.locator("nav a[data-screen=clusters]").click()
    page.get_by_role("button", name="New cluster").click()
    form = page.locator("form[data-cluster-form]")
    form.get_by_label("Name").fill("east")
    form.get_by_role("button", name="Create cluster").click()
    expect(form.get_by_role("alert")).to_have_text("Cluster east already exists.")
    screenshot(page, shots["duplicate_name"])
    form.get_by_role("button", name="Cancel").click()
    expect(form).to_have_count(0)


def join_worker(page, expected, copied, cluster_id, shots):
    """The copied command, run as it is on "another machine", joins the new cluster: its
    page and the list count the worker and its GPU. Answers the worker's process."""
    args = shlex.split(copied)
    assert args[:2] == ["gantry", "worker"], args
    with open(expected["joined_log"], "w") as log:
        worker = subprocess.Popen([expected["gantry"]] + args[1:] + expected["joined_args"],
                                  stdout=log, stderr=subprocess.STDOUT)
    go(page, f"clusters/{cluster_id}")
    # The page reads the cluster every 5 s.
    expect(page.locator("[data-fact=workers]")).to_contain_text("1 of 1", timeout=40_000)
    expect(page.locator(".page-head .badge").first).to_have_text("ready")
    expect(page.locator("[data-fact=gpus] strong")).to_have_text("1")
    expect(page.locator("[data-part=state-message]")).to_have_text("1 of 1 workers ready.")
    page.locator("nav a[data-screen=clusters]").click()
    east = page.locator("tr[data-cluster=east]")
    expect(east.locator("[data-part=workers]")).to_have_text("1 / 1")
    expect(east.locator("[data-part=gpus]")).to_have_text("1")
    expect(east).to_contain_text("The racks in the east room")
    screenshot(page, shots["clusters_list"])
    page.set_viewport_size(PHONE)
    for key in (east.get_by_role("link", name="east", exact=True), east.locator("[data-part=state] .badge"),
                east.locator("[data-part=workers]"), east.get_by_role("link", name="Join"),
                east.get_by_role("button", name="Edit"), east.get_by_role("button", name="Delete")):
        expect(key).to_be_in_viewport()
    screenshot(page, shots["clusters_phone"])
    page.set_viewport_size(DESKTOP)
    return worker


def workers_by_cluster(page, cluster_id, shots):
    """Two clusters: the workers list offers the choice and names each worker's cluster;
    chosen, it lists that cluster's workers only (as the server filters them)."""
    page.locator("nav a[data-screen=workers]").click()
    rows = page.locator("table[data-workers] tbody tr")
    expect(rows).to_have_count(2)
    joined = page.locator("tr[data-worker=east-1]")
    expect(joined.locator("[data-worker-cluster]")).to_have_text("cluster east")
    # The join box joins the default cluster, and says where the others' commands are.
    join = page.locator("[data-join]")
    join.locator("summary").click()
    expect(join.locator("[data-join-other-clusters]")).to_contain_text("This command joins the default cluster.")
    expect(join.locator("[data-join-other-clusters] a")).to_have_attribute("href", "#/clusters")
    join.locator("summary").click()
    choice = page.locator("select[data-cluster-filter]")
    expect(choice).to_be_visible()
    choice.select_option("east")
    expect(page).to_have_url(re.compile(rf"#/workers\?cluster={cluster_id}$"))
    expect(rows).to_have_count(1)
    expect(joined.locator(".badge").first).to_have_text("ready")
    # One cluster shown: the rows need not name it.
    expect(joined.locator("[data-worker-cluster]")).to_have_count(0)
    screenshot(page, shots["workers_filtered"])
    choice = page.locator("select[data-cluster-filter]")
    expect(choice).to_have_value(str(cluster_id))
    choice.select_option("")
    expect(page).to_have_url(re.compile(r"#/workers$"))
    expect(rows).to_have_count(2)


def deploy_into_cluster(page, expected, cluster_id, shots):
    """The model form offers the clusters, the default one chosen on the unfiltered list
    and the shown one on a filtered list; the model deployed into the new cluster runs on
    its worker, and its page names the cluster."""
    page.locator("nav a[data-screen=models]").click()
    page.get_by_role("button", name="New model").click()
    chooser = page.locator("select[data-cluster-select]")
    expect(chooser).to_be_visible()
    expect(chooser.locator("option:checked")).to_have_text("default (default)")
    page.get_by_role("button", name="Cancel").click()

    go(page, f"models?cluster={cluster_id}")
    expect(page.get_by_text("No models in east yet.", exact=False)).to_be_visible()
    page.get_by_role("button", name="New model").click()
    form = page.locator("form", has=page.locator("select[data-cluster-select]"))
    expect(chooser.locator("option:checked")).to_have_text("east")
    form.get_by_role("textbox", name="Name").fill("tiny-east")
    form.get_by_role("textbox", name="Path").fill(expected["model_path"])
    form.get_by_role("textbox", name="Backend arguments").fill("-c 256 -t 1 -tb 1 -np 1")
    form.get_by_role("button", name="Check fit").click()
    estimate = form.locator("[data-estimate]")
    # The estimate is the cluster's: its one worker.
    expect(estimate.locator("[data-estimate-worker]")).to_have_count(1)
    expect(estimate.locator("[data-estimate-worker=east-1]")).to_be_visible()
    screenshot(page, shots["model_form_cluster"])
    form.get_by_role("button", name="Create model").click()
    row = page.locator("tr", has=page.get_by_text("tiny-east", exact=True))
    expect(row.locator(".badge")).to_have_text("1 / 1", timeout=RUNNING_TIMEOUT_MS)
    status, models = api(page, expected, "GET", "/api/v1/models?name=tiny-east")
    assert status == 200 and models["items"][0]["cluster_id"] == cluster_id, models
    status, instances = api(page, expected, "GET", f"/api/v1/model-instances?cluster_id={cluster_id}")
    assert status == 200, instances
    assert [i["worker_name"] for i in instances["items"]] == ["east-1"], instances

    row.get_by_role("link", name="tiny-east").click()
    setting = page.locator("[data-setting=cluster]")
    expect(setting).to_have_text("east")
    expect(setting.locator("a")).to_have_attribute("href", f"#/clusters/{cluster_id}")
    expect(page.locator("[data-model-health]")).to_have_text("1 / 1 running")
    screenshot(page, shots["model_page"])

    # The instances and the overview, each of one cluster.
    go(page, "instances")
    choice = page.locator("select[data-cluster-filter]")
    choice.select_option("east")
    expect(page.locator("tr[data-instance]")).to_have_count(1)
    expect(page.locator("tr[data-instance]")).to_contain_text("tiny-east-0")
    choice = page.locator("select[data-cluster-filter]")
    choice.select_option("default")
    expect(page.get_by_text("No instances: they appear when a model has replicas.")).to_be_visible()
    go(page, "overview")
    page.locator("select[data-cluster-filter]").select_option("east")
    cards = page.locator(".card")
    expect(cards.filter(has_text="Workers").locator(".big")).to_have_text("1")
    expect(cards.filter(has_text="Models").locator(".big")).to_have_text("1")
    expect(cards.filter(has_text="Workers").get_by_role("link", name="View")).to_have_attribute(
        "href", f"#/workers?cluster={cluster_id}")
    screenshot(page, shots["overview_filtered"])


def delete_refused(page, shots):
    """A cluster with a worker and a model cannot go: the sentence naming them stays in the
    dialog, and the cluster stays."""
    page.locator("nav a[data-screen=clusters]").click()
    east = page.locator("tr[data-cluster=east]")
    expect(east.locator("[data-part=models]")).to_have_text("1")
    east.get_by_role("button", name="Delete").click()
    dialog = page.locator("dialog")
    expect(dialog.get_by_role("heading")).to_have_text("Delete cluster east?")
    dialog.get_by_role("button", name="Delete cluster").click()
    alert = dialog.get_by_role("alert")
    expect(alert).to_have_text(re.compile(
        r"^Cluster east is in use by worker\(s\) east-1 and model\(s\) tiny-east; .* first\.$"))
    screenshot(page, shots["delete_refused"])
    dialog.get_by_role("button", name="Cancel").click()
    expect(dialog).to_have_count(0)
    expect(east).to_be_visible()


def rotate(page, expected, cluster_id, copied, shots):
    """Rotate token asks first, saying registered workers keep working; then the page shows
    the new command, and the joined worker stays ready."""
    go(page, f"clusters/{cluster_id}")
    join = page.locator("[data-cluster-join]")
    command = join.locator("[data-join-command]")
    expect(command).to_have_text(copied)
    join.get_by_role("button", name="Rotate token").click()
    dialog = page.locator("dialog")
    expect(dialog.get_by_role("heading")).to_have_text("Rotate the registration token of east?")
    expect(dialog).to_contain_text("Workers already registered keep working")
    screenshot(page, shots["rotate_confirm"])
    dialog.get_by_role("button", name="Rotate token").click()
    expect(dialog).to_have_count(0)
    expect(command).not_to_have_text(copied)
    expect(command).to_have_text(re.compile(r"--token gantryreg_\S+$"))
    status, registration = api(page, expected, "GET", f"/api/v1/clusters/{cluster_id}/registration-token")
    assert status == 200 and registration["command"] == command.inner_text(), registration
    status, workers = api(page, expected, "GET", f"/api/v1/workers?cluster_id={cluster_id}")
    assert status == 200 and [w["state"] for w in workers["items"]] == ["ready"], workers


def kubernetes(page, shots):
    """A Kubernetes cluster's page has its manifests, with the image chosen, to copy; an
    empty cluster is deleted from its page."""
    page.locator("nav a[data-screen=clusters]").click()
    page.get_by_role("button", name="New cluster").click()
    form = page.locator("form[data-cluster-form]")
    form.get_by_label("Name").fill("gpu-nodes")
    form.get_by_label("Provider").select_option("kubernetes")
    form.get_by_role("button", name="Create cluster").click()
    expect(page.locator("h1")).to_have_text("Cluster gpu-nodes")
    join = page.locator("[data-cluster-join]")
    manifests = join.locator("[data-manifests]")
    expect(manifests).to_contain_text("kind: DaemonSet")
    expect(manifests).to_contain_text("nvidia.com/gpu.present")
    token = re.search(r"--token (\S+)$", join.locator("[data-join-command]").inner_text()).group(1)
    expect(manifests).to_contain_text(f'token: "{token}"')
    join.get_by_label("Image").fill("registry.example.com/gantry:1.2")
    join.get_by_role("button", name="Use this image").click()
    expect(manifests).to_contain_text('image: "registry.example.com/gantry:1.2"')
    expect(join.get_by_label("Image")).to_have_value("registry.example.com/gantry:1.2")
    copy = join.locator(".join-command", has=page.locator("[data-manifests]")).get_by_role("button", name="Copy")
    copy.click()
    copied = page.evaluate("navigator.clipboard.readText()")
    assert "kind: DaemonSet" in copied and 'image: "registry.example.com/gantry:1.2"' in copied, copied
    quiet(page)
    screenshot(page, shots["kubernetes"])
    screenshot(page, shots["kubernetes_phone"], PHONE)
    # An image that is no image reference: the server's refusal, as a sentence, and the
    # manifests as they were.
    join.get_by_label("Image").fill("not an image")
    join.get_by_role("button", name="Use this image").click()
    expect(join.get_by_role("alert")).to_have_text(re.compile(r"^The image must be an image reference .*\.$"))
    expect(manifests).to_contain_text('image: "registry.example.com/gantry:1.2"')

    page.locator(".page-head").get_by_role("button", name="Delete").click()
    dialog = page.locator("dialog")
    dialog.get_by_role("button", name="Delete cluster").click()
    expect(page.locator("h1")).to_have_text("Clusters")
    expect(page.locator("tr[data-cluster=east]")).to_be_visible()
    expect(page.locator("tr[data-cluster=gpu-nodes]")).to_have_count(0)


def users(page, expected, shots):
    """A user made the administrator of a cluster when created; the list names it, and
    "Clusters" changes it."""
    page.locator("nav a[data-screen=users]").click()
    page.get_by_role("button", name="New user").click()
    form = page.locator("form", has=page.get_by_role("heading", name="New user"))
    form.get_by_role("textbox", name="Username").fill("carol")
    form.locator("input[type=password]").fill("carol-password-1")
    choice = form.locator("[data-cluster-choice]")
    expect(choice.locator("label")).to_have_text(["default", "east"])
    choice.get_by_label("east").check()
    form.get_by_role("button", name="Create user").click()
    carol = page.locator("tr", has=page.get_by_text("carol", exact=True))
    expect(carol.locator("[data-part=clusters]")).to_have_text("east")
    admin = page.locator("tr", has=page.locator("strong", has_text=re.compile("^admin$")))
    expect(admin.locator("[data-part=clusters]")).to_have_text("every cluster (admin)")
    carol.get_by_role("button", name="Clusters").click()
    dialog = page.locator("dialog")
    expect(dialog.get_by_label("east")).to_be_checked()
    dialog.get_by_label("default").check()
    screenshot(page, shots["users_clusters"])
    dialog.get_by_role("button", name="Save clusters").click()
    expect(carol.locator("[data-part=clusters] .chip")).to_have_text(["default", "east"])
    status, listed = api(page, expected, "GET", "/api/v1/users")
    assert status == 200, listed
    assert [u["cluster_admin_of"] for u in listed["items"] if u["username"] == "carol"] == [[1, 2]], listed


def field(scope, label):
    """The control of the form field whose label is `label`: a field's label text is its
    label followed at once by its hint (which starts with a capital), and a hint may name
    another field."""
    return scope.get_by_label(re.compile("^" + re.escape(label) + "(?![a-z])"))


def within_width(locator, width):
    """The element lies within the page's width: nothing of it is cut off on a phone."""
    locator.scroll_into_view_if_needed()
    box = locator.bounding_box()
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= width + 1, box


def pools(page, expected, shots):
    """A worker pool on a new cluster's page: refused with a sentence while its program is
    not in pool_commands_dir, then made with the testkit's cloud, which refuses its
    machines; their message and the failed event say why in the provider's words. Changed,
    then deleted after a confirmation that its machines go too."""
    quiet(page)
    status, lab = api(page, expected, "POST", "/api/v1/clusters", {"name": "lab"})
    assert status == 201, lab
    go(page, f"clusters/{lab['id']}")
    expect(page.locator("h1")).to_have_text("Cluster lab")
    section = page.locator("[data-pools]")
    expect(section.locator(".pools-empty")).to_contain_text("No worker pools")
    section.get_by_role("button", name="New pool").click()
    form = section.locator("form[data-pool-form]")
    # DigitalOcean's fields first; exec's once it is chosen.
    expect(field(form, "Provider")).to_have_value("digitalocean")
    expect(field(form, "API URL")).to_be_visible()
    expect(field(form, "Command")).to_be_hidden()
    field(form, "Name").fill("burst")
    field(form, "Provider").select_option("exec")
    expect(field(form, "API URL")).to_be_hidden()
    field(form, "Command").fill("missing.sh")
    field(form, "GPUs per machine").fill("1x80GiB")
    field(form, "Min machines").fill("1")
    field(form, "Max machines").fill("2")
    form.get_by_role("button", name="Create pool").click()
    expect(form.get_by_role("alert")).to_have_text(re.compile(
        r"^The command /\S+/pool-commands/missing\.sh is not an executable file; put the pool's program in "
        r"/\S+/pool-commands on every server \(only programs there run\)\.$"))
    screenshot(page, shots["pool_refused"])

    field(form, "Command").fill("cloud.sh --region lab-1")
    field(form, "Region").fill("lab-1")
    field(form, "Labels").fill("tier=burst")
    field(form, "Idle time").fill("30s")
    field(form, "Credentials").fill("lab-secret")
    form.get_by_role("button", name="Create pool").click()
    expect(form).to_have_count(0)
    pool = section.locator("[data-pool=burst]")
    expect(pool.locator("[data-part=provider]")).to_have_text("exec")
    expect(pool.locator("[data-setting=bounds]")).to_contain_text("1–2")
    expect(pool.locator("[data-setting=command]")).to_contain_text("cloud.sh --region lab-1")
    expect(pool.locator("[data-setting=credentials]")).to_have_text(re.compile("has credentials"))
    # min 1: the leader asks for a machine at once; the cloud refuses it, and the machine
    # and the pool's events say so in its words.
    machine = pool.locator("tr[data-machine=burst-1]")
    expect(machine.locator("[data-part=message]")).to_contain_text(
        "out of capacity: no GPUs left in region lab-1", timeout=30_000)
    expect(machine.locator("[data-part=message]")).to_contain_text("creating machine failed")
    expect(machine.locator("[data-part=state] .badge")).to_have_text("provisioning")
    failed = pool.locator("[data-events] li[data-event=failed]").first
    expect(failed).to_contain_text("creating machine burst-1 failed")
    expect(failed).to_contain_text("out of capacity: no GPUs left in region lab-1")
    expect(failed.locator(".badge")).to_have_text("failed")
    # The cluster says machines are on the way rather than asking for the join command.
    expect(page.locator(".page-head .badge").first).to_have_text("provisioning")
    expect(page.locator("[data-part=state-message]")).to_contain_text("machine(s) of its worker pools are being made")
    assert "lab-secret" not in page.content(), "the page shows the pool's credentials"
    status, listed = api(page, expected, "GET", f"/api/v1/clusters/{lab['id']}/worker-pools")
    assert status == 200 and listed[0]["has_credentials"] and "credentials" not in listed[0], listed
    quiet(page)
    screenshot(page, shots["pool_failing"])
    page.set_viewport_size(PHONE)
    for key in (pool.get_by_role("button", name="Edit"), pool.get_by_role("button", name="Delete"),
                machine.locator("[data-part=state]"), machine.locator("[data-part=worker]"), failed):
        within_width(key, PHONE["width"])
    page.evaluate("window.scrollTo(0, 0)")
    screenshot(page, shots["pool_failing_phone"], PHONE)
    page.set_viewport_size(DESKTOP)

    # Changed from its dialog: a min above max is refused with a sentence, then the
    # bounds, labels and idle time are saved.
    pool.get_by_role("button", name="Edit").click()
    dialog = page.locator("dialog")
    expect(dialog.get_by_role("heading")).to_have_text("Edit pool burst")
    expect(field(dialog, "Labels")).to_have_value("tier=burst")
    field(dialog, "Min machines").fill("5")
    dialog.get_by_role("button", name="Save").click()
    expect(dialog.get_by_role("alert")).to_have_text("The minimum must be at most max (2).")
    screenshot(page, shots["pool_edit_refused"])
    field(dialog, "Min machines").fill("1")
    field(dialog, "Max machines").fill("3")
    field(dialog, "Labels").fill("tier=spot")
    field(dialog, "Idle time").fill("1m")
    dialog.get_by_role("button", name="Save").click()
    expect(dialog).to_have_count(0)
    expect(pool.locator("[data-setting=bounds]")).to_contain_text("1–3")
    expect(pool.locator("[data-setting=labels] .chip")).to_have_text(["tier=spot"])
    expect(pool.locator("[data-setting=scale-down-after]")).to_contain_text("1m")
    status, listed = api(page, expected, "GET", f"/api/v1/clusters/{lab['id']}/worker-pools")
    assert status == 200, listed
    assert (listed[0]["min"], listed[0]["max"], listed[0]["labels"]) == (1, 3, {"tier": "spot"}), listed
    assert listed[0]["has_credentials"], listed

    # Deleted after a confirmation that says its machine goes too; then the pool is gone.
    pool.get_by_role("button", name="Delete").click()
    expect(dialog.get_by_role("heading")).to_have_text("Delete pool burst?")
    expect(dialog).to_contain_text("Its 1 machine will be deleted at the provider")
    screenshot(page, shots["pool_delete"])
    dialog.get_by_role("button", name="Delete pool").click()
    expect(dialog).to_have_count(0)
    expect(pool).to_have_count(0, timeout=30_000)
    expect(section.locator(".pools-empty")).to_be_visible()
    status, body = api(page, expected, "DELETE", f"/api/v1/clusters/{lab['id']}")
    assert status in (200, 204), body


def main():
    expected = json.loads(sys.argv[1])
    shots = expected["screenshots"]
    worker = None
    stopped = None

    def steps(page):
        nonlocal worker
        first_login(page, expected)
        navigation(page)
        copied, cluster_id = new_cluster(page, expected, shots)
        duplicate_name(page, shots)
        worker = join_worker(page, expected, copied, cluster_id, shots)
        workers_by_cluster(page, cluster_id, shots)
        deploy_into_cluster(page, expected, cluster_id, shots)
        delete_refused(page, shots)
        rotate(page, expected, cluster_id, copied, shots)
        kubernetes(page, shots)
        users(page, expected, shots)
        pools(page, expected, shots)

    # A cluster of a name taken (409), a cluster with a worker and a model (409), an image
    # that is no image reference (400, a bad query), a pool's program outside
    # pool_commands_dir and a pool's min above its max (422) are refused on purpose. The
    # events of a pool that went between the page's two reads answer 404.
    on_purpose = re.compile(r"status of (400|409|422) .*/api/v1/clusters|status of 404 .*/worker-pools/\d+/events")
    try:
        run_session(expected, steps, on_purpose=lambda p: bool(on_purpose.search(p)), clipboard=True)
    finally:
        if worker is not None:
            worker.send_signal(signal.SIGTERM)
            try:
                stopped = worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                worker.kill()
                raise
    assert stopped == 0, f"the joined worker exited with {stopped}"
    print("console clusters checks passed")


if __name__ == "__main__":
    main()
