"""The suite's pytest-xdist layout (tests/conftest.py): the tests of one plane run on one worker, so each plane comes
up once per run, and two planes start on two workers; so do the tests of a costly shared fixture (the review).
Checked by running pytest itself on a small suite whose `lab`, `from_zero` and `reviewed` fixtures stand in for
the real ones (the module's own fixtures shadow conftest's)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent

SUITE = '''
import os
import pytest


@pytest.fixture(scope="session")
def lab():
    return os.getpid()


@pytest.fixture(scope="session")
def from_zero():
    return os.getpid()


@pytest.fixture(scope="session")
def deployed(lab):
    return lab


@pytest.mark.parametrize("n", range(4))
def test_on_the_lab(lab, n):
    pass


@pytest.mark.parametrize("n", range(3))
def test_on_what_the_lab_deployed(deployed, n):
    pass


@pytest.mark.parametrize("n", range(3))
def test_from_zero(from_zero, n):
    pass


@pytest.fixture(scope="module")
def reviewed():
    return os.getpid()


@pytest.mark.parametrize("n", range(3))
def test_on_the_review(reviewed, n):
    pass


@pytest.mark.parametrize("n", range(6))
def test_without_a_plane(n):
    pass
'''


def write_suite(tmp_path: Path, suite: str, **modules: str) -> None:
    """A small suite in `tmp_path` under the project's own conftest (executed, so its hooks and scheduler apply):
    `suite` as test_suite.py, and each of `modules` as <name>.py."""
    (tmp_path / "conftest.py").write_text(
        f"import sys\nsys.path.insert(0, {str(TESTS)!r})\n"
        f"exec(compile(open({str(TESTS / 'conftest.py')!r}).read(), 'conftest.py', 'exec'))\n")
    (tmp_path / "test_suite.py").write_text(suite)
    for name, text in modules.items():
        (tmp_path / f"{name}.py").write_text(text)


def test_each_planes_tests_run_on_one_worker_and_the_rest_spread(tmp_path: Path) -> None:
    write_suite(tmp_path, SUITE)
    done = subprocess.run([sys.executable, "-m", "pytest", "-n", "3", "-v", "-p", "no:cacheprovider",
                           "--rootdir", str(tmp_path), str(tmp_path)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    workers: dict[str, set[str]] = {}
    for worker, test in re.findall(r"\[(gw\d+)\] \[\s*\d+%\] PASSED \S+::(\w+)\[", done.stdout):
        workers.setdefault(test, set()).add(worker)
    assert sum(1 for _ in re.finditer(r"PASSED", done.stdout)) == 19, done.stdout[-3000:]
    lab = workers["test_on_the_lab"] | workers["test_on_what_the_lab_deployed"]
    assert len(lab) == 1, f"the lab's tests ran on {sorted(lab)}: each of those workers brings up a lab"
    assert len(workers["test_from_zero"]) == 1
    assert lab != workers["test_from_zero"], "two planes share one worker while a third does nothing else"
    assert len(workers["test_on_the_review"]) == 1, "the review's fixture was made on each worker its tests ran on"


EVENTS_SUITE = '''
import os
import pytest

EVENTS = os.environ["EVENTS"]


def note(what):
    with open(EVENTS, "a") as handle:
        handle.write(what + "\\n")


def plane(name):
    note(f"up {name}")
    yield name
    note(f"down {name}")


@pytest.fixture(scope="session")
def lab():
    yield from plane("lab")


@pytest.fixture(scope="session")
def deployed(lab):
    yield from plane("deployed")


@pytest.fixture(scope="session")
def from_zero():
    yield from plane("from_zero")


def test_lab_first(lab):
    note("test lab_first")


def test_from_zero(from_zero):
    note("test from_zero")


def test_without_a_plane():
    note("test without_a_plane")


def test_on_what_the_lab_deployed(deployed):
    note("test deployed")


def test_lab_last(lab):
    note("test lab_last")
'''


def test_a_plane_comes_up_once_and_goes_when_its_last_test_ends(tmp_path: Path) -> None:
    """In one process (-n 0), the file's order interleaves the lab's tests with another plane's: the lab's are run
    together where the first stands, its fixtures end as soon as the next test uses none of them (not at the end of
    the session), and each plane comes up once."""
    write_suite(tmp_path, EVENTS_SUITE)
    events = tmp_path / "events"
    done = subprocess.run([sys.executable, "-m", "pytest", "-n", "0", "-p", "no:cacheprovider",
                           "--rootdir", str(tmp_path), str(tmp_path)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, check=False, env={**os.environ, "EVENTS": str(events)})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert events.read_text().splitlines() == [
        "up lab", "test lab_first", "up deployed", "test deployed", "test lab_last", "down deployed", "down lab",
        "up from_zero", "test from_zero", "down from_zero", "test without_a_plane"]


DATAPLANE_MODULE = '''
import pytest


@pytest.fixture(scope="module")
def data_plane():
    return "engines"


@pytest.mark.parametrize("n", range(2))
def test_engine(data_plane, n):
    pass
'''


def test_the_data_planes_modules_run_on_one_worker_the_drain_last(tmp_path: Path) -> None:
    """Every module of engines on one worker (they take turns on a lock anyway, and a second worker would wait on it),
    Ray's and the drain's after the others, the drain at the very end; the rest spread over the other workers."""
    modules = ["test_dataplane_drain", "test_dataplane_metrics", "test_dataplane_ray", "test_dataplane_vllm"]
    write_suite(tmp_path, SUITE, **dict.fromkeys(modules, DATAPLANE_MODULE))
    done = subprocess.run([sys.executable, "-m", "pytest", "-n", "3", "-v", "-p", "no:cacheprovider",
                           "--rootdir", str(tmp_path), str(tmp_path)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ran = re.findall(r"\[(gw\d+)\] \[\s*\d+%\] PASSED (\w+)\.py::(\w+)\[", done.stdout)
    engines = [(worker, module) for worker, module, _ in ran if module.startswith("test_dataplane_")]
    assert len(engines) == 8 and len({worker for worker, _ in engines}) == 1, engines
    order = list(dict.fromkeys(module for _, module in engines))
    assert order == ["test_dataplane_metrics", "test_dataplane_vllm", "test_dataplane_ray", "test_dataplane_drain"]
    others = {worker for worker, module, _ in ran if not module.startswith("test_dataplane_")}
    assert others - {engines[0][0]}, "the engines' worker took the rest as well"
