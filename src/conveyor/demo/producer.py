"""The demo's producer: a burst of jobs at the start, then a few per second and a wave now
and then, enqueued from a thread of its own."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Callable

from . import (
    build_report,
    call_partner_webhook,
    charge_card,
    refresh_feed,
    resize_image,
    send_welcome_email,
    sync_inventory,
)

GOOD_SKUS = [f"SKU-{n:05d}" for n in (10234, 10871, 20417, 31337, 40960, 52001, 60666, 77810)]
BAD_SKUS = ["SKU-1O234", "SKU-", "sku 40960", "SKU-999999"]  # typos, as they happen in real feeds


class Producer:
    """Enqueues a burst of ~60 jobs, then a few per second until stopped."""

    def __init__(self, stop: threading.Event, rng: random.Random | None = None) -> None:
        self.stop = stop
        self.rng = rng or random.Random()
        self.enqueued = 0
        self.errors = 0
        self._ids: Counter[str] = Counter()
        self._mix: list[tuple[int, Callable[[], None]]] = [
            (25, self._email), (18, self._resize), (16, self._charge), (12, self._inventory),
            (14, self._feed), (8, self._report), (2, self._webhook), (3, self._bad_sku),
        ]

    def _next(self, kind: str, base: int) -> int:
        self._ids[kind] += 1
        return base + self._ids[kind]

    def burst(self) -> None:
        """The start: 60 jobs, mostly in batches (one store transaction per ``enqueue_many``)."""
        jobs = send_welcome_email.enqueue_many([(self._next("user", 1000),) for _ in range(12)])
        for _ in range(3):  # drip emails: scheduled a few seconds ahead
            delay = self.rng.uniform(2.0, 6.0)
            send_welcome_email.options(delay=delay).enqueue(self._next("user", 1000))
        images = [self._next("image", 5000) for _ in range(5)]
        jobs += resize_image.enqueue_many([(i, w) for i in images for w in (320, 1280)])
        jobs += charge_card.enqueue_many([(self._next("order", 7000),) for _ in range(8)])
        for _ in range(2):  # express checkout jumps the line: lower priority runs first
            charge_card.options(priority=-10).enqueue(self._next("order", 7000))
        skus = [*GOOD_SKUS[:6], BAD_SKUS[0], BAD_SKUS[1]]
        jobs += sync_inventory.enqueue_many([(sku,) for sku in skus])
        jobs += refresh_feed.enqueue_many([(self._next("user", 1000),) for _ in range(8)])
        jobs += build_report.enqueue_many([(self._next("report", 300),) for _ in range(6)])
        jobs += call_partner_webhook.enqueue_many([(17,), (42,)])
        self.enqueued += len(jobs) + 5

    def run(self) -> None:
        next_wave = time.monotonic() + self.rng.uniform(6.0, 10.0)
        while not self.stop.wait(self.rng.uniform(0.15, 0.45)):
            if time.monotonic() >= next_wave:
                next_wave = time.monotonic() + self.rng.uniform(10.0, 16.0)
                try:
                    self.enqueued += self.wave()
                except Exception:
                    self.errors += 1
                    logging.getLogger("conveyor.demo").exception("producer: enqueue failed")
            for _ in range(self.rng.choice((1, 1, 2))):
                step = self.rng.choices([f for _, f in self._mix], [w for w, _ in self._mix])[0]
                try:
                    step()
                    self.enqueued += 1
                except Exception:
                    self.errors += 1
                    logging.getLogger("conveyor.demo").exception("producer: enqueue failed")

    def wave(self) -> int:
        """Now and then a batch arrives at once, so queues build up a backlog and drain it."""
        kind = self.rng.choice(("signups", "catalog", "reports"))
        if kind == "signups":  # a marketing email went out: many new users at once
            jobs = send_welcome_email.enqueue_many([(self._next("user", 1000),) for _ in range(40)])
        elif kind == "catalog":  # a seller uploaded a catalog: every image in three widths
            images = [self._next("image", 5000) for _ in range(15)]
            jobs = resize_image.enqueue_many([(i, w) for i in images for w in (320, 640, 1280)])
        else:  # end of day: the low-priority queue gets a pile of reports
            jobs = build_report.enqueue_many([(self._next("report", 300),) for _ in range(12)])
        return len(jobs)

    def _email(self) -> None:
        user = self._next("user", 1000)
        if self.rng.random() < 0.2:
            send_welcome_email.options(delay=self.rng.uniform(1.0, 5.0)).enqueue(user)
        else:
            send_welcome_email.enqueue(user)

    def _resize(self) -> None:
        resize_image.enqueue(self._next("image", 5000), self.rng.choice((320, 640, 1280)))

    def _charge(self) -> None:
        order = self._next("order", 7000)
        priority = -10 if self.rng.random() < 0.15 else 0
        charge_card.options(priority=priority).enqueue(order)

    def _inventory(self) -> None:
        sync_inventory.enqueue(self.rng.choice(GOOD_SKUS))

    def _bad_sku(self) -> None:
        sync_inventory.enqueue(self.rng.choice(BAD_SKUS))

    def _feed(self) -> None:
        refresh_feed.enqueue(self._next("user", 1000))

    def _report(self) -> None:
        build_report.enqueue(self._next("report", 300))

    def _webhook(self) -> None:
        call_partner_webhook.enqueue(self.rng.choice((17, 42, 99)))

