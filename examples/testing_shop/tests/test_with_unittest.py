"""Testing tasks with unittest: a temporary store per test and ``drain``."""

import tempfile
import unittest

import shop

from conveyor.testing import JobFailed, drain, temporary_store, using_store


class ShopTasks(unittest.TestCase):
    def setUp(self):
        directory = self.enterContext(tempfile.TemporaryDirectory())
        # A SQLite file in the directory; temporary_store($CONVEYOR_TEST_URL, ...) for
        # a schema or key prefix of its own on PostgreSQL or Redis.
        url = self.enterContext(temporary_store(None, directory))
        self.app = self.enterContext(using_store(shop.app, url))  # back afterwards

    def test_an_order_sends_its_receipt(self):
        shop.place_order.enqueue(42, "ada@example.com")

        ran = drain(self.app)

        self.assertEqual([job.result for job in ran],
                         [42, "receipt 42 sent to ada@example.com (attempt 1)"])

    def test_a_failing_task_fails_the_test(self):
        shop.send_receipt.options(max_attempts=1).enqueue(7, "not-an-address")

        with self.assertRaises(JobFailed) as failed:
            drain(self.app)

        self.assertEqual(failed.exception.error["type"], "ValueError")


if __name__ == "__main__":
    unittest.main()
