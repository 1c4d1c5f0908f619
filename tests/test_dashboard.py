"""`ablate dashboard`: a real optuna-dashboard server on a real SQLite study, opened in headless Chromium.

Needs Debian's chromium and chromium-driver (/usr/bin/chromium, /usr/bin/chromedriver) and the
selenium package; skipped with the reason when one is missing. Nothing is downloaded.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest

from ports import free_port, wait_for_port

STUDY = "dash-study"
ROOT = Path(__file__).resolve().parents[1]




def _ablate(*args: str) -> list[str]:
    return [sys.executable, "-m", "ablate", *args]


def _make_study(db: Path) -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name=STUDY, storage=f"sqlite:///{db}", direction="minimize")
    for i, lr in enumerate((3e-4, 1e-3, 2e-3)):
        trial = study.ask({"lr": optuna.distributions.FloatDistribution(1e-4, 1e-2, log=True)})
        trial.set_user_attr("bleu", 20.0 + i)
        trial.set_user_attr("run_dir", f"runs/sweeps/{STUDY}/trial-{i}")
        study.tell(trial, 10.0 - i * lr * 1000)


def _start(tmp_path: Path) -> tuple[subprocess.Popen, int]:
    """`ablate dashboard` on a free port of 127.0.0.1 for a new study, once it listens."""
    db = tmp_path / "sweeps.db"
    _make_study(db)
    port = free_port()
    proc = subprocess.Popen(_ablate("dashboard", "--storage", f"sqlite:///{db}", "--port", str(port)),
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wait_for_port(port, proc, timeout=30)
    return proc, port


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    """`ablate dashboard` on a free port of 127.0.0.1; stopped with SIGINT (must exit 0)."""
    proc, port = _start(tmp_path)
    url = f"http://127.0.0.1:{port}"
    try:
        yield url
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            out = proc.communicate(timeout=10)[0]
        except subprocess.TimeoutExpired:
            proc.kill()
            out = proc.communicate()[0]
            pytest.fail(f"dashboard ignored SIGINT: {out}")
    assert proc.returncode == 0, out
    assert f"{url}/" in out and "Traceback" not in out, out


def _wait_text(driver, *texts: str, timeout: float = 20) -> str:
    """The page's visible text once it shows every one of `texts`."""
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.support.ui import WebDriverWait

    def shown(d) -> str | bool:
        try:
            body = d.find_element("tag name", "body").text
        except WebDriverException:  # the React app re-rendered the body under us
            return False
        return body if all(t in body for t in texts) else False

    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.2).until(shown)
    except Exception:
        body = driver.find_element("tag name", "body").text
        pytest.fail(f"{driver.current_url} never showed {texts}; it shows:\n{body[:2000]}")


def test_dashboard_in_browser(server: str, browser, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(server + "/")  # redirects to the study list
    _wait_text(browser, STUDY)
    link = WebDriverWait(browser, 20).until(
        ec.element_to_be_clickable((By.XPATH, "//a[contains(@href, '/dashboard/studies/')]"
                                              f"[contains(., '{STUDY}')]")))
    link.click()
    WebDriverWait(browser, 20).until(ec.url_matches(r"/dashboard/studies/\d+$"))
    _wait_text(browser, f"{STUDY} (id=", "Best Trial")
    browser.get(browser.current_url + "/trials")  # the trial list of this study
    body = _wait_text(browser, "3 Trials", "Trial 0", "Trial 1", "Trial 2", "User Attributes", "bleu")
    assert "Complete" in body
    shot = tmp_path / "dashboard.png"
    assert browser.save_screenshot(str(shot))
    data = shot.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 1000


def _refused(capfd: pytest.CaptureFixture, *args: str) -> tuple[int, str, str]:
    """`ablate ARGS` in this process (a refusal before anything serves: no signal, no server):
    its exit status, and what it printed on stdout and stderr (file descriptors included)."""
    from ablate.cli import main

    capfd.readouterr()
    code = main(list(args))
    out, err = capfd.readouterr()
    return code, out, err


@pytest.mark.parametrize("storage", ["sqlite:///{tmp}/missing.db", "not a url"])
def test_dashboard_bad_storage(storage: str, tmp_path: Path, capfd) -> None:
    url = storage.format(tmp=tmp_path)
    code, out, err = _refused(capfd, "dashboard", "--storage", url, "--port", str(free_port()))
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ablate: error:"), err
    assert out == ""
    assert not (tmp_path / "missing.db").exists()


def test_dashboard_port_in_use(tmp_path: Path, capfd) -> None:
    db = tmp_path / "sweeps.db"
    _make_study(db)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, _, err = _refused(capfd, "dashboard", "--storage", f"sqlite:///{db}", "--port", str(port))
    assert code == 2, err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == f"ablate: error: cannot listen on 127.0.0.1:{port}: " \
                                           "Address already in use", err


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_that_lands_while_requests_are_served_stops_the_dashboard(tmp_path: Path, sig) -> None:
    """Four clients request back to back, then the signal: the dashboard exits 0, without a
    traceback. A Ctrl-C that landed inside a request used to be lost (wsgiref's request handler
    catches every exception to answer 500), and the dashboard went on serving."""
    proc, port = _start(tmp_path)
    stop, served = threading.Event(), []

    def client() -> None:
        while not stop.is_set():
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies", timeout=10) as response:
                    served.append(response.status)
            except OSError:  # refused or cut once the server stops
                time.sleep(0.05)

    clients = [threading.Thread(target=client, daemon=True) for _ in range(4)]
    for thread in clients:
        thread.start()
    try:
        deadline = time.monotonic() + 60
        while len(served) < 20 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(served) >= 20, "the dashboard answered fewer than 20 requests in 60 s"
        proc.send_signal(sig)
        out = proc.communicate(timeout=60)[0]  # a bound, not a speed target
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"the dashboard went on serving after {sig.name}: {proc.communicate()[0][-2000:]}")
    finally:
        stop.set()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0 and "Traceback" not in out, out[-2000:]
