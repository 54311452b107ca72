"""The dashboard on a broker: with a companion store every page works from the records; a
broker alone shows its overview and says plainly, page by page, what it cannot show."""

from __future__ import annotations

from brokerkit import Broker, alone, with_state
from starlette.testclient import TestClient

from conveyor import Conveyor
from conveyor.dashboard.app import create_app


def client(app: Conveyor) -> TestClient:
    return TestClient(create_app(app), base_url="http://127.0.0.1", client=("127.0.0.1", 5000))


@alone
def test_a_broker_alone_says_what_it_cannot_show(broker: Broker) -> None:
    app = Conveyor(broker.url)
    try:
        with client(app) as c:
            overview = c.get("/")
            assert overview.status_code == 200
            assert "keeps no history" in overview.text
            for path in ("/jobs", "/dead", "/jobs/1", "/cron"):
                page = c.get(path)
                assert page.status_code == 501, path
                assert "Not available on this store" in page.text
                assert "companion store" in page.text
    finally:
        app.close()


@with_state
def test_with_a_companion_store_every_page_works(broker: Broker) -> None:
    app = Conveyor(broker.url, state=broker.state)

    @app.task(name="work")
    def work(n: int) -> None:
        pass

    try:
        job = work.enqueue(1)
        with client(app) as c:
            for path in ("/", "/jobs", "/dead", f"/jobs/{job.id}", "/cron", "/workers"):
                page = c.get(path)
                assert page.status_code == 200, (path, page.text[:300])
            assert "work" in c.get(f"/jobs/{job.id}").text
    finally:
        app.close()
