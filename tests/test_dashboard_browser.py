"""The dashboard in a real headless browser (Debian's chromium, driven by Playwright), on a
real history: a simulated run with a failing site, then a deployed run (TLS, site keys, 3
sites) watched live while it records rounds. One site is stopped with SIGSTOP: the page
turns red, the coordinator prints its warning line, its Prometheus endpoint says the same
(parsed by prometheus-client's own parser). Screenshots go to ``$FEDWEAVE_TEST_ARTEFACTS``
(default ``.test-artefacts/`` in the repository)."""

from __future__ import annotations

import os
import shutil
import signal
import ssl
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_deploy_support import (
    Processes,
    coordinator_args,
    free_port,
    make_deployment,
    run_fedweave,
    signal_tree,
    site_args,
    wait_for,
    wait_for_success,
)

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTEFACTS = Path(os.environ.get("FEDWEAVE_TEST_ARTEFACTS", REPO / ".test-artefacts"))
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
DEADLINE = 8
STALL_AFTER = 2

pytestmark = pytest.mark.skipif(
    not Path(CHROMIUM).exists(),
    reason="no chromium: install Debian's chromium (scripts/test does) for the browser tests",
)


def _metrics(port: int, ca: Path) -> dict[tuple[str, tuple], float]:
    """One scrape of the coordinator's /metrics: HTTPS with its own certificate (made for
    localhost), as a Prometheus given the CA would scrape it."""
    context = ssl.create_default_context(cafile=str(ca))
    with urllib.request.urlopen(f"https://localhost:{port}/metrics", timeout=10,
                                context=context) as answer:  # fmt: skip
        text = answer.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_live_run_in_a_browser(tmp_path: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    ARTEFACTS.mkdir(parents=True, exist_ok=True)
    make_deployment(tmp_path, 3)
    db = f"sqlite:///{tmp_path / 'history.db'}"
    env_path = os.pathsep.join(p for p in (str(REPO / "tests"), os.environ.get("PYTHONPATH")) if p)
    os.environ["PYTHONPATH"] = env_path  # fault_tasks for the simulation and its sites
    simulated = run_fedweave(
        "simulate", "--task", "fault_tasks:RaisingDigits", "--clients", "3", "--rounds", "2",
        "--partition", "iid", "--no-secure-agg", "--db", db, "--out", "report.json",
        cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert simulated.returncode == 0, simulated.stderr[-3000:]
    from fedweave.history import open_store

    with open_store(db) as store:
        simulated_id = store.list_runs()[0].run_id

    procs = Processes(tmp_path)
    dash_port, coord_port, metrics_port, status_port = (free_port() for _ in range(4))
    hung = None
    try:
        dashboard = procs.start(
            "dashboard", "dashboard", "--db", db, "--address", f"127.0.0.1:{dash_port}",
            "--stall-after", str(STALL_AFTER),
        )  # fmt: skip
        coordinator = procs.start(
            "coordinator",
            *coordinator_args(
                coord_port, db, 9, 3, "--once", "--no-secure-agg", "--round-timeout",
                str(DEADLINE), "--stall-after", str(STALL_AFTER), "--metrics-address",
                f"127.0.0.1:{metrics_port}",
            ),
        )  # fmt: skip
        sites = [
            procs.start(f"site{i}", *site_args(coord_port, i, None, *(
                ("--status-address", f"127.0.0.1:{status_port}") if i == 0 else ())))
            for i in range(3)
        ]  # fmt: skip
        wait_for(lambda: "dashboard of" in procs.output("dashboard"), 60, "the dashboard",
                 dashboard, lambda: procs.output("dashboard"))  # fmt: skip
        base = f"http://127.0.0.1:{dash_port}"
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))

            # the runs list, with the deployed run appearing in it without a reload
            page.goto(base + "/")
            expect(page.locator(f'tr[data-run="{simulated_id}"]')).to_be_visible()
            deployed_row = page.locator("tr[data-run]").filter(has_text="running")
            expect(deployed_row).to_have_count(1, timeout=120_000)
            deployed_id = deployed_row.get_attribute("data-run")
            assert deployed_id and deployed_id != simulated_id
            page.screenshot(path=ARTEFACTS / "dashboard-runs.png", full_page=True)

            # the live run: its curves grow while rounds are recorded
            page.goto(f"{base}/runs/{deployed_id}")
            main = page.locator("#main")
            wait_for(
                lambda: int(main.get_attribute("data-rounds") or 0) >= 2, 180,
                "two rounds on the page", coordinator, lambda: procs.output("coordinator"),
            )  # fmt: skip
            drawn = int(main.get_attribute("data-rounds") or 0)
            loss_chart = page.locator('figure[data-title="loss"]')
            loss_points = int(loss_chart.get_attribute("data-points"))
            assert loss_points >= drawn - 1
            expect(page.locator("#in-flight p.flight")).to_contain_text("round", timeout=30_000)

            # a site stops (a frozen VM): late, then late again: the page turns red
            hung = sites[2]
            signal_tree(hung, signal.SIGSTOP)
            alert = page.locator("#alerts p.alert").filter(has_text="site site2 late")
            expect(alert).to_be_visible(timeout=(STALL_AFTER + 2) * (DEADLINE + 6) * 1000)
            assert int(main.get_attribute("data-rounds")) > drawn  # grew without a reload
            expect(page.locator('tr[data-site="site2"]')).to_have_class("alert-row")
            page.screenshot(path=ARTEFACTS / "dashboard-live-run.png", full_page=True)
            scraped = _metrics(metrics_port, tmp_path / "tls" / "ca.pem")
            run = (("run_id", deployed_id),)
            site2 = (("run_id", deployed_id), ("site", "site2"))
            assert scraped[("fedweave_site_late_in_a_row", site2)] >= STALL_AFTER
            assert scraped[("fedweave_alert", run)] == 1
            assert scraped[("fedweave_rounds_completed", run)] >= STALL_AFTER + 1
            assert scraped[("fedweave_sites_connected", run)] == 3  # stopped, still connected

            page.goto(base + "/")
            expect(page.locator(f'tr[data-run="{deployed_id}"] .badge.alert')).to_be_visible()
            page.screenshot(path=ARTEFACTS / "dashboard-runs-alert.png", full_page=True)

            signal_tree(hung, signal.SIGCONT)
            hung = None

            # the stopped site's own page: each late round with its reason
            page.goto(f"{base}/runs/{deployed_id}/sites/site2")
            expect(page.locator("#problems")).to_contain_text("no reply within the round deadline")
            page.screenshot(path=ARTEFACTS / "dashboard-site.png", full_page=True)

            # the simulated run: the failing site's reason is on its run page
            page.goto(f"{base}/runs/{simulated_id}")
            expect(page.locator("#sites-table")).to_contain_text("RuntimeError: injected fault")

            # site0's own view of what it contributed
            page.goto(f"http://127.0.0.1:{status_port}/")
            expect(page.locator("#connection")).to_have_text("connected")
            expect(page.locator("#site-runs tbody tr")).to_have_count(1)
            expect(page.locator("#privacy-floor")).to_have_text(
                "privacy floor: none (takes part in any run)"
            )
            page.screenshot(path=ARTEFACTS / "site-status.png", full_page=True)

            out = wait_for_success(procs, coordinator, "the run to complete", timeout=300)

            # the two runs compared on one chart
            page.goto(f"{base}/compare?run={simulated_id}&run={deployed_id}")
            accuracy = page.locator('figure[data-title="accuracy"]')
            expect(accuracy).to_be_visible()
            expect(accuracy.locator(".u-legend .u-series")).to_have_count(2)  # one per run
            page.screenshot(path=ARTEFACTS / "dashboard-compare.png", full_page=True)

            missing = page.goto(f"{base}/runs/0123456789ab")
            assert missing is not None and missing.status == 404
            expect(page.locator("#message")).to_contain_text("no run '0123456789ab'")
            assert not errors, errors
            browser.close()
    finally:
        if hung is not None:
            signal_tree(hung, signal.SIGCONT)
        procs.close()
    assert f"warning: site site2 late {STALL_AFTER} rounds in a row" in out, out[-3000:]
    assert f"Prometheus metrics of run {deployed_id} at https://127.0.0.1:{metrics_port}" in out
    status_lines = procs.output("site0")
    assert f"this site's status at http://127.0.0.1:{status_port}/" in status_lines
