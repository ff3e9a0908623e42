"""pytest plugin of the fault suite: the `fast` marker, the `fault_run` fixture that builds one
scenario (fresh private servers, a Cluster, its history, workload and nemesis), and the final
table printed at the end of the session and written to `test-artifacts/faults.json`.

Invariant: each scenario runs on its own fresh PostgreSQL and Redis, and every process it
started is stopped at teardown, pass or fail; only checker results reach the table.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.faults.checker import Checker, CheckResult
from tests.faults.cluster import Cluster
from tests.faults.history import History
from tests.faults.nemesis import Nemesis
from tests.faults.report import FaultReport
from tests.faults.workload import Workload

REPO = Path(__file__).resolve().parents[2]
ARTIFACT = REPO / "test-artifacts" / "faults.json"
REPORT_KEY = pytest.StashKey[FaultReport]()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "fast: a quick fault scenario (also run by make test)")
    config.stash[REPORT_KEY] = FaultReport()


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    report = config.stash.get(REPORT_KEY, None)
    if report is None or not report.rows:
        return
    terminalreporter.write_sep("=", "fault scenarios")
    terminalreporter.write_line(report.table())
    report.write(ARTIFACT)
    terminalreporter.write_line(f"(written to {ARTIFACT.relative_to(REPO)})")


@pytest.fixture
def fault_report(request: pytest.FixtureRequest) -> FaultReport:
    return request.config.stash[REPORT_KEY]


@dataclass
class FaultRun:
    """One scenario: its cluster, history, nemesis and workload, and the judgement."""

    name: str
    cluster: Cluster
    history: History
    nemesis: Nemesis
    workload: Workload
    report: FaultReport
    results: list[CheckResult] = field(default_factory=list)

    def start(self, wait: bool = True) -> None:
        """Start the cluster's services (when `fault_run` was told `start=False`); `wait` as
        in `Cluster.start_services`."""
        self.cluster.start_services(wait=wait)
        self.workload.api_url = self.cluster.api_url

    def check(self, **options: Any) -> CheckResult:
        """Run the checker, add its row to the final table, return the result."""
        result = Checker(self.cluster, self.history, self.name, **options).check()
        self.report.add(result.row())
        self.results.append(result)
        return result

    def assert_clean(self, result: CheckResult) -> None:
        assert result.violations == [], (
            f"{len(result.violations)} violations (logs in {self.cluster.workdir}):\n"
            + "\n".join(result.violations[:40]))


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


@pytest.fixture
def fault_run(request: pytest.FixtureRequest, fresh_postgres, fresh_redis, tmp_path: Path,
              fault_report: FaultReport) -> Iterator[Callable[..., FaultRun]]:
    """`fault_run(name, **cluster_options)` -> a started FaultRun on fresh servers; with
    `start=False`, its database is made but no service started (`FaultRun.start`)."""
    made: list[FaultRun] = []

    def make(name: str, start: bool = True, **options: Any) -> FaultRun:
        assert not made, "one fault_run per test: each scenario gets fresh servers"
        workdir = tmp_path / _slug(name)
        cluster = Cluster(fresh_postgres, fresh_redis, workdir, **options)
        history = History(workdir / "history.jsonl")
        run = FaultRun(name, cluster, history, Nemesis(cluster, history),
                       Workload("", history), fault_report)
        made.append(run)
        cluster.on_restart = run.nemesis.supervised_restart
        cluster.start(services=start)
        run.workload.api_url = cluster.api_url
        return run

    yield make
    for run in made:
        run.cluster.close()
        run.history.close()
